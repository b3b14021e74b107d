// Package clienttest drives the real coding-agent CLIs (Claude Code, Codex, OpenCode and
// Qwen Code, pinned in package.json and package-lock.json, installed by `npm ci` here)
// non-interactively through Caddy with `lb_policy warden` to simulated vLLM replicas, and
// checks that each conversation stays on one replica while two conversations land on
// different ones; and runs the README's quick start as written (TestQuickStart). Its tests
// skip where the CLIs are not installed, and fail under CI (CI set), where
// .ci/run installs them.
package clienttest
