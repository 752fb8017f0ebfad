package upstreamsvc

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// serviceClient lists and watches core/v1 Services through client-go's REST client. Its scheme knows
// Services and the meta/v1 types around them, nothing else: the typed clientset
// (k8s.io/client-go/kubernetes) links and registers every API group at init, which made up most of a node
// cache's resident memory before the first query, for a plugin that reads one Service.
//
// The requests are the ones the typed client sends: the same paths, parameters, Accept header (protobuf
// preferred, JSON accepted) and timeouts.
type serviceClient struct {
	rest   rest.Interface
	params runtime.ParameterCodec
}

// newServiceClient returns a client for the API server and credentials in rc.
func newServiceClient(rc *rest.Config) (*serviceClient, error) {
	scheme := runtime.NewScheme()
	gv := corev1.SchemeGroupVersion
	scheme.AddKnownTypes(gv, &corev1.Service{}, &corev1.ServiceList{})
	metav1.AddToGroupVersion(scheme, gv)
	// Unversioned list options, as client-go's own scheme registers them for the parameter codec.
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})

	config := *rc
	config.GroupVersion = &gv
	config.APIPath = "/api"
	config.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if config.UserAgent == "" {
		config.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	client, err := rest.RESTClientFor(&config)
	if err != nil {
		return nil, fmt.Errorf("creating Kubernetes REST client: %w", err)
	}
	return &serviceClient{rest: client, params: runtime.NewParameterCodec(scheme)}, nil
}

// list returns the Services in namespace that opts selects. Like the typed client, it returns a list
// (empty) also with an error, so the informer never holds a nil object in a non-nil interface.
func (c *serviceClient) list(ctx context.Context, namespace string, opts metav1.ListOptions) (*corev1.ServiceList, error) {
	list := &corev1.ServiceList{}
	err := c.rest.Get().
		UseProtobufAsDefault().
		Namespace(namespace).
		Resource("services").
		VersionedParams(&opts, c.params).
		Timeout(timeoutOf(opts)).
		Do(ctx).
		Into(list)
	return list, err
}

// watch watches the Services in namespace that opts selects.
func (c *serviceClient) watch(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.rest.Get().
		UseProtobufAsDefault().
		Namespace(namespace).
		Resource("services").
		VersionedParams(&opts, c.params).
		Timeout(timeoutOf(opts)).
		Watch(ctx)
}

// timeoutOf is the request timeout the API server is asked for in opts, 0 for none.
func timeoutOf(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}
