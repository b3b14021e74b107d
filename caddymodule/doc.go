// Package caddymodule is the Caddy side of warden: the `warden` app (global
// option) with its supervised vLLM processes, the `warden` reverse_proxy
// selection policy, the `warden` upstream source (`dynamic warden`), the
// admin API routes, the `warden_panel` handler, the `warden_stop_reason`
// handler (load control's reading of the replies' ends) and the Prometheus
// collector.
// Routing decisions live in package selection and the model's runtime in
// package fleet; this package only adapts them to Caddy's lifecycle.
package caddymodule
