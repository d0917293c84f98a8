//go:build tools

// The commands built from this module, imported here so that go mod tidy
// keeps their packages' requirements.
package tools

import (
	_ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
	_ "sigs.k8s.io/jobset"
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
