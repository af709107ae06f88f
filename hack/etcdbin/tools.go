//go:build tools

// Package etcdbin only pins the etcd server that hack/build-control-plane.sh builds.
package etcdbin

import (
	_ "go.etcd.io/etcd/server/v3"
)
