// olm-validate checks an OLM bundle directory with the operator-framework/api validation
// library, the rules `operator-sdk bundle validate` applies to a bundle's content: the
// ClusterServiceVersion (required fields, name and version, install modes, install strategy,
// owned CRDs against the CRDs in the bundle), the CRDs, and the other objects (PDBs, roles).
// It prints every error and warning and exits 1 when there is an error.
//
// usage: olm-validate <bundle dir>   (the folder holding manifests/ and metadata/)
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: olm-validate <bundle dir>")
		os.Exit(2)
	}
	bundle, err := manifests.GetBundleFromDir(filepath.Join(os.Args[1], "manifests"))
	if err != nil {
		fmt.Printf("ERROR bundle: %v\n", err)
		os.Exit(1)
	}
	validators := validation.DefaultBundleValidators.WithValidators(validation.ObjectValidator)
	errors := 0
	checked := 0
	for _, result := range validators.Validate(bundle.ObjectsToValidate()...) {
		checked++
		for _, e := range result.Errors {
			errors++
			fmt.Printf("ERROR %s: %s\n", result.Name, e.Error())
		}
		for _, w := range result.Warnings {
			fmt.Printf("WARNING %s: %s\n", result.Name, w.Error())
		}
	}
	fmt.Printf("checked %d results of bundle %s: %d errors\n", checked, bundle.Name, errors)
	if errors > 0 {
		os.Exit(1)
	}
}
