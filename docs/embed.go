// Package docs holds corral's operator documents: the OpenAPI description
// of the daemon's HTTP API (embedded, served at /openapi.json) and the
// systemd units under systemd/.
package docs

import _ "embed"

// OpenAPI is the OpenAPI 3.1 document of the daemon's API (openapi.json).
//
//go:embed openapi.json
var OpenAPI []byte
