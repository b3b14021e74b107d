// Package caddywarden is the caddy-warden plugin as xcaddy and Caddy's
// builders import it: `xcaddy build --with github.com/lmwarden/caddy-warden`
// generates a main package that blank-imports this module's root, and this
// import registers every warden module with Caddy. The code lives in
// package caddymodule.
package caddywarden

import (
	// The warden app, the lb_policy, the upstream source, the admin routes
	// and the panel handler.
	_ "github.com/lmwarden/caddy-warden/caddymodule"
)
