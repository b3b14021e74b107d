package metricsfeed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// textFormatAccept asks for the classic Prometheus text format: vLLM's
// exporter would otherwise be free to negotiate OpenMetrics.
const textFormatAccept = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

// StatusError is returned for a response whose status is not 200 OK.
type StatusError struct {
	URL  string
	Code int
}

// Error names the URL and the status.
func (e *StatusError) Error() string {
	return fmt.Sprintf("GET %s: status %d", e.URL, e.Code)
}

// ErrTooLarge means a response body exceeded the caller's byte limit.
var ErrTooLarge = errors.New("metricsfeed: response body too large")

// Fetch GETs a vLLM /metrics URL and parses it. The request ends with ctx
// (give it a deadline); a non-200 status, a body longer than maxBytes, or an
// unparsable body is an error. A nil client means http.DefaultClient.
func Fetch(ctx context.Context, client *http.Client, url string, maxBytes int64) (Scrape, error) {
	body, err := get(ctx, client, url, textFormatAccept, maxBytes)
	if err != nil {
		return Scrape{}, err
	}
	return Parse(bytes.NewReader(body))
}

// healthBodyLimit bounds how much of a /health answer, or of an error
// answer, is read (vLLM sends little); reading it lets the connection be
// reused.
const healthBodyLimit = 4 << 10

// ProbeHealth GETs a vLLM /health URL: nil means status 200. vLLM answers 503
// when its engine is dead, even while /metrics still answers.
func ProbeHealth(ctx context.Context, client *http.Client, url string) error {
	_, err := get(ctx, client, url, "", healthBodyLimit)
	return err
}

// get returns the whole body of a 200 response, refusing one longer than
// maxBytes rather than returning it truncated.
func get(ctx context.Context, client *http.Client, url, accept string, maxBytes int64) ([]byte, error) {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("metricsfeed: %w", err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metricsfeed: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Draining a short error body lets the connection be reused.
		_, _ = io.CopyN(io.Discard, resp.Body, healthBodyLimit)
		return nil, &StatusError{URL: url, Code: resp.StatusCode}
	}
	if resp.ContentLength > maxBytes {
		return nil, fmt.Errorf("%w: GET %s: %d bytes announced, limit %d", ErrTooLarge, url, resp.ContentLength, maxBytes)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("metricsfeed: GET %s: %w", url, err)
	}
	if int64(len(body)) > maxBytes {
		return nil, fmt.Errorf("%w: GET %s: more than %d bytes", ErrTooLarge, url, maxBytes)
	}
	return body, nil
}
