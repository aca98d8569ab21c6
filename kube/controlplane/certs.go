package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// certValidity bounds every certificate the control plane makes: it lives
// for one test run or one person's session.
const certValidity = 7 * 24 * time.Hour

// authority is a certificate authority generated for one control plane.
type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}

func newAuthority(cn string) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: cn},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := sign(tmpl, &key.PublicKey, tmpl, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &authority{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// keyPair is a PEM certificate and its PEM private key.
type keyPair struct{ cert, key []byte }

// issue signs a new key's certificate for a server (dns and ips as its
// names) or, when server is false, a client (cn as its user, orgs as its
// groups).
func (a *authority) issue(cn string, orgs []string, server bool, dns []string, ips []net.IP) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, err
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: orgs},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		DNSNames:    dns,
		IPAddresses: ips,
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	der, err := sign(tmpl, &key.PublicKey, a.cert, a.key)
	if err != nil {
		return keyPair{}, err
	}
	keyPEM, err := privateKeyPEM(key)
	if err != nil {
		return keyPair{}, err
	}
	return keyPair{cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: keyPEM}, nil
}

func sign(tmpl *x509.Certificate, pub any, parent *x509.Certificate, parentKey crypto.Signer) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Minute)
	tmpl.NotAfter = time.Now().Add(certValidity)
	return x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
}

func privateKeyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// serviceAccountKey returns a new PEM private key (the API server signs
// service-account tokens with it, the controller manager too) and its PEM
// public key (the API server verifies them with it).
func serviceAccountKey() (private, public []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	if private, err = privateKeyPEM(key); err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, nil, err
	}
	return private, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// writeFiles writes each name's content, readable by its owner only.
func writeFiles(files map[string][]byte) error {
	for name, data := range files {
		if err := os.WriteFile(name, data, 0o600); err != nil {
			return fmt.Errorf("controlplane: %w", err)
		}
	}
	return nil
}
