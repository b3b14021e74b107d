package pinstore

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/redisproc"
	"github.com/lmwarden/caddy-warden/internal/testnet"
)

// TLS to a redis-server with a self-signed certificate: accepted with
// TLSInsecure, refused (certificate error) without it.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	selfSigned(t, cert, key)
	tlsAddr := testnet.Addr(t)
	_, port, _ := net.SplitHostPort(tlsAddr)
	redisproc.StartTest(t, "--tls-port", port, "--tls-cert-file", cert, "--tls-key-file", key, "--tls-auth-clients", "no")
	testnet.WaitListening(t, tlsAddr, 10*time.Second)

	s := open(t, tlsAddr, func(c *Config, _ *Options) { c.TLSEnabled, c.TLSInsecure = true, true })
	if p, ok := s.Claim(1, "a"); !ok || p != "a" {
		t.Fatalf("claim over TLS: %q %v %+v", p, ok, s.Status())
	}
	strict := open(t, tlsAddr, func(c *Config, _ *Options) { c.TLSEnabled = true })
	if _, ok := strict.Claim(2, "a"); ok {
		t.Fatal("a self-signed certificate was accepted without tls_insecure")
	}
	if e := strict.Status().LastError; !strings.Contains(e, "certificate") {
		t.Fatalf("last error %q", e)
	}
}

func selfSigned(t *testing.T, certFile, keyFile string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "redis test"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, b []byte) {
		if err := os.WriteFile(name, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(certFile, "CERTIFICATE", der)
	write(keyFile, "EC PRIVATE KEY", kder)
}
