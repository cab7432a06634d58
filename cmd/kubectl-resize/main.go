// Command kubectl-resize is a kubectl plugin (kubectl resize POD ...) that
// resizes a container of a pod in place through the pods/resize
// subresource, with the user's own kubeconfig and rights, waits for the
// kubelet's verdict and prints it with what the resize agent on the node
// measured. See docs/kubectl-resize.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, newClient)
	stop()
	os.Exit(code)
}
