// Package caddymodule is the Caddy side of warden: the `warden` app (global
// option) with its supervised vLLM processes, the `warden` reverse_proxy
// selection policy, the `warden` upstream source (`dynamic warden`), the
// admin API routes, the `warden_panel`, `warden_models` and
// `warden_stop_reason` handlers and the `warden_model` matcher.
// Routing decisions live in package selection and a request's state in
// package inflight, a model's runtime in packages fleet and livemodel,
// what operators see in packages panel and metrics; this package only
// adapts them to Caddy's config and lifecycle.
package caddymodule
