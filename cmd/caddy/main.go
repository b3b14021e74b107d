// Command caddy is Caddy with the warden plugin, the main package that
// `xcaddy build --with github.com/lmwarden/caddy-warden` generates: it imports
// the module's root package, as every xcaddy build does. Building it from
// the repository needs no network once the module cache is warm.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// plug in Caddy modules here
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/lmwarden/caddy-warden"
)

func main() {
	caddycmd.Main()
}
