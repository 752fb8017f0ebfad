package upstreamsvc

import (
	"context"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

const (
	// apiStartupTimeout bounds the one List done during setup, so an unreachable API server delays
	// startup by at most this long before the environment or fallback is used.
	apiStartupTimeout = 5 * time.Second
	// watchStopTimeout bounds how long shutdown waits for the informer to return.
	watchStopTimeout = 10 * time.Second
	// userAgent names the plugin's requests to the API server.
	userAgent = "nodelocaldns-upstreamsvc"
)

// follower receives what the API says about a Service.
type follower interface {
	follow(serviceView)
}

// serviceWatch follows one Service through the Kubernetes API. All upstreamsvc blocks of one Corefile
// that name the same Service (and kubeconfig) share one, so a node opens one watch per Service.
type serviceWatch struct {
	client    *serviceClient
	namespace string
	name      string
	selector  string // metadata.name=NAME: the API sends only this Service

	mu        sync.Mutex
	latest    serviceView
	known     bool  // latest holds an answer from the API
	primeErr  error // why the API did not answer during setup, while !known
	followers []follower

	cancel context.CancelFunc
	done   chan struct{}
}

func newServiceWatch(client *serviceClient, namespace, name string) *serviceWatch {
	return &serviceWatch{
		client:    client,
		namespace: namespace,
		name:      name,
		selector:  fields.OneTermEqualSelector("metadata.name", name).String(),
	}
}

func (w *serviceWatch) String() string { return w.namespace + "/" + w.name }

// prime asks the API once for the Service so setup can use the answer; ctx bounds the wait.
func (w *serviceWatch) prime(ctx context.Context) {
	list, err := w.client.list(ctx, w.namespace, metav1.ListOptions{FieldSelector: w.selector})
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.primeErr = err
		return
	}
	w.known = true
	w.latest = serviceView{}
	for i := range list.Items {
		if list.Items[i].Name == w.name {
			w.latest = viewOf(&list.Items[i])
		}
	}
}

// snapshot returns the latest answer and whether there is one; err says why there is none.
func (w *serviceWatch) snapshot() (v serviceView, known bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.latest, w.known, w.primeErr
}

// subscribe adds f and hands it the latest answer, so nothing observed before f joined is lost.
func (w *serviceWatch) subscribe(f follower) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.followers = append(w.followers, f)
	if w.known {
		f.follow(w.latest)
	}
}

func (w *serviceWatch) unsubscribe(f follower) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i := slices.Index(w.followers, f); i >= 0 {
		w.followers = slices.Delete(w.followers, i, i+1)
	}
}

// publish records v and tells every follower. Followers run under w.mu so they see changes in order.
func (w *serviceWatch) publish(v serviceView) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.latest, w.known, w.primeErr = v, true, nil
	for _, f := range w.followers {
		f.follow(v)
	}
}

func (w *serviceWatch) observe(obj any) {
	svc, ok := obj.(*corev1.Service)
	if !ok || svc.Name != w.name || svc.Namespace != w.namespace {
		return
	}
	w.publish(viewOf(svc))
}

func (w *serviceWatch) forget(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if svc, ok := obj.(*corev1.Service); ok && (svc.Name != w.name || svc.Namespace != w.namespace) {
		return
	}
	w.publish(serviceView{})
}

// start runs an informer on the one Service until stop. The informer lists and watches with the
// field selector, reconnects with backoff, and re-lists when the watch expires; if the API did not
// answer during setup, its first successful list switches the followers to the API's address.
func (w *serviceWatch) start() error {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = w.selector
			return w.client.list(ctx, w.namespace, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = w.selector
			return w.client.watch(ctx, w.namespace, opts)
		},
	}
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: cache.ToListWatcherWithWatchListSemantics(lw, w.client),
		ObjectType:    &corev1.Service{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    w.observe,
			UpdateFunc: func(_, obj any) { w.observe(obj) },
			DeleteFunc: w.forget,
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	w.done = make(chan struct{})
	go func() {
		defer close(w.done)
		informer.RunWithContext(ctx)
	}()
	return nil
}

// stop ends the informer and waits for it, so a reload does not leave a watch behind. A watch that
// does not stop in time is logged rather than returned: an OnShutdown error would abort caddy's
// reload after the new instance is already serving.
func (w *serviceWatch) stop() error {
	if w.cancel == nil {
		return nil
	}
	w.cancel()
	w.cancel = nil
	select {
	case <-w.done:
	case <-time.After(watchStopTimeout):
		log.Errorf("Watch of Service %s did not stop within %s", w, watchStopTimeout)
	}
	return nil
}
