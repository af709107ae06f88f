//go:build tools

// Package s3bin only pins the SeaweedFS server (an S3-compatible object store) that
// hack/build-s3.sh builds for the backup tests.
package s3bin

import (
	_ "github.com/seaweedfs/seaweedfs/weed"
)
