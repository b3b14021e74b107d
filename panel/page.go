package panel

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"html/template"
	"net/http"

	"github.com/munnerz/goautoneg"
)

//go:embed assets
var assets embed.FS

// page is the panel's HTML with its style and script inline, and the
// Content-Security-Policy that allows exactly those and requests to its own
// origin.
type page struct {
	html   []byte
	policy string
}

var thePage = buildPage()

// Page is the panel's HTML page, self-contained (no request leaves the
// site) and refreshing itself from the JSON twin, and the
// Content-Security-Policy to serve it with.
func Page() (html []byte, policy string) { return thePage.html, thePage.policy }

func buildPage() page {
	read := func(name string) string {
		b, err := assets.ReadFile("assets/" + name)
		if err != nil {
			panic(err) // embedded at build time: cannot fail
		}
		return string(b)
	}
	style, script := read("panel.css"), read("panel.js")
	tmpl := template.Must(template.New("panel").Parse(read("panel.html")))
	var html bytes.Buffer
	err := tmpl.Execute(&html, struct {
		Style  template.CSS
		Script template.JS
	}{template.CSS(style), template.JS(script)})
	if err != nil {
		panic(err)
	}
	return page{
		html: html.Bytes(),
		policy: "default-src 'none'; connect-src 'self'; img-src 'self' data:; " +
			"style-src " + sourceHash(style) + "; script-src " + sourceHash(script) +
			"; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
	}
}

// sourceHash is the CSP source expression that allows one inline element.
func sourceHash(content string) string {
	sum := sha256.Sum256([]byte(content))
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

// WantsJSON reports whether a request for the panel asks for its JSON
// twin: with ?format=json, or an Accept header that prefers JSON to HTML.
// Browsers navigating and clients without an Accept header get the page.
func WantsJSON(r *http.Request) bool {
	switch r.URL.Query().Get("format") {
	case "json":
		return true
	case "html":
		return false
	}
	return goautoneg.Negotiate(r.Header.Get("Accept"), []string{"text/html", "application/json"}) == "application/json"
}
