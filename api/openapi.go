package api

import _ "embed" // the OpenAPI document

// OpenAPI is the OpenAPI 3.1 document of the daemon's API (openapi.yaml
// beside this file), which the daemon serves at GET /v1/openapi.yaml: a
// description of every route, its parameters, bodies, answers and errors,
// for generating clients in other languages.
//
//go:embed openapi.yaml
var OpenAPI string
