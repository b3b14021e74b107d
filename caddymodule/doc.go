// Package caddymodule holds the Caddy adapters of warden.
package caddymodule

import (
	_ "github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/common/expfmt"
	_ "github.com/dustin/go-humanize"
	_ "go.uber.org/zap"
)
