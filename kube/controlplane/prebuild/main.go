// Command prebuild builds the control plane's programs into
// $CORRAL_TEST_CACHE (controlplane.Build) so that tests find them built:
// .ci/run runs it before `go test`, whose timeout is then not spent on the
// build. It prints where the binaries are.
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/corral-sandbox/corral/kube/controlplane"
)

func main() {
	bins, err := controlplane.Build(context.Background(), "", func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, format+"\n", args...)
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(bins.APIServer)
	fmt.Println(bins.ControllerManager)
	fmt.Println(bins.Scheduler)
	fmt.Println(bins.Etcd)
}
