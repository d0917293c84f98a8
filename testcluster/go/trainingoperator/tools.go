//go:build tools

// The command built from this module, imported here so that go mod tidy
// keeps its package's requirements.
package tools

import _ "github.com/kubeflow/training-operator/cmd/training-operator.v1"
