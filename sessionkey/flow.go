package sessionkey

import (
	"hash/maphash"
	"net/http"
	"strings"
)

// flowSeed keys the flows' hashes: a credential's hash shown in the admin
// API or the metrics must not let a reader test guesses of a weak password
// against it, as an unkeyed hash would. The ids so change when the process
// restarts, never across config reloads.
var flowSeed = maphash.MakeSeed()

// Flow is whose request r is, hashed with a key of the process (never
// stored in clear): the value of header when set and sent, else the
// credential of the Authorization header (its scheme left out, so that a
// key sent as a bearer token or as x-api-key is one flow), else x-api-key's
// value; 0 when the request carries none.
func Flow(h http.Header, header string) uint64 {
	if header != "" {
		if v := h.Get(header); v != "" {
			return flowOf(v)
		}
	}
	if v := h.Get("Authorization"); v != "" {
		if _, credential, ok := strings.Cut(v, " "); ok {
			v = strings.TrimSpace(credential)
		}
		return flowOf(v)
	}
	if v := h.Get("X-Api-Key"); v != "" {
		return flowOf(v)
	}
	return 0
}

func flowOf(v string) uint64 { return nonZero(maphash.String(flowSeed, v)) }
