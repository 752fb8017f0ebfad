// Package kubeclient is what this module's clients of the Kubernetes API share: where their credentials come
// from. upstreamsvc follows its Service with it, and node-cache watches its DaemonSet.
package kubeclient

import (
	"errors"
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config returns credentials for the Kubernetes API, with userAgent: from kubeconfig when given, else
// in-cluster. It returns a nil config and the reason when neither is available; a kubeconfig that cannot be
// loaded is an error, because it was asked for explicitly.
func Config(kubeconfig, userAgent string) (*rest.Config, string, error) {
	if kubeconfig != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, "", fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
		}
		return rest.AddUserAgent(rc, userAgent), "", nil
	}
	rc, err := rest.InClusterConfig()
	if errors.Is(err, rest.ErrNotInCluster) {
		return nil, "no Kubernetes API (not running in a cluster and no kubeconfig given)", nil
	}
	if err != nil {
		// A pod without a service-account token (automountServiceAccountToken: false) lands here.
		return nil, fmt.Sprintf("no Kubernetes API (in-cluster credentials unusable: %v)", err), nil
	}
	return rest.AddUserAgent(rc, userAgent), "", nil
}
