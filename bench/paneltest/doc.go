// Package paneltest holds the browser test of warden's panel: headless
// Chromium (through chromedp) reads the page that Caddy, built from the root
// module's cmd/caddy, serves in front of simulated vLLM replicas
// (bench/vllmsim/server), and the test compares it with the admin API's
// JSON. It lives in the bench module so that chromedp stays out of the
// plugin's go.mod; it has no code outside its tests.
//
// The test needs Chromium on PATH (on Debian: apt-get install chromium). Without
// it the test is skipped, or fails when the CI environment variable is set.
package paneltest
