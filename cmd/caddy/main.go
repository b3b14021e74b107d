// Command caddy is Caddy with the warden plugin, as `xcaddy build --with
// github.com/lmwarden/caddy-warden` would produce it. Building it from the
// repository needs no network once the module cache is warm.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/lmwarden/caddy-warden/caddymodule"
)

func main() {
	caddycmd.Main()
}
