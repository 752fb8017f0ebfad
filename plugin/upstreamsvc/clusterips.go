package upstreamsvc

import (
	"context"
	"fmt"
	"net/netip"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// ClusterIPs lists Service namespace/name through the API rc reaches and returns its ClusterIPs, primary
// family first: all of a dual-stack Service's, where the variable the kubelet sets (HostEnvVar) names the
// primary one only. It lists with a field selector on the name, as the plugin's watch does, which the
// manifests' Role allows for kube-dns-upstream.
func ClusterIPs(ctx context.Context, rc *rest.Config, namespace, name string) ([]netip.Addr, error) {
	c, err := newServiceClient(rc)
	if err != nil {
		return nil, err
	}
	list, err := c.list(ctx, namespace, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return nil, fmt.Errorf("listing Service %s/%s: %w", namespace, name, err)
	}
	for i := range list.Items {
		if list.Items[i].Name != name {
			continue
		}
		v := viewOf(&list.Items[i])
		if v.problem != nil {
			return nil, v.problem
		}
		return v.ips, nil
	}
	return nil, fmt.Errorf("no Service %s/%s", namespace, name)
}
