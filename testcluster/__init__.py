"""A real Kubernetes control plane for tests and for trying Regatta by hand.

etcd, kube-apiserver, kube-scheduler and kube-controller-manager built from
one Kubernetes release, kwok for nodes and pod lifecycles, and the Kubeflow
training-operator (PyTorchJob), each built from Go modules at the versions
pinned in testcluster/go/*/go.mod and run as local processes on loopback
ports. `python -m testcluster --help` lists the verbs; docs/kubernetes.md
says what is real here and what kwok simulates.
"""
