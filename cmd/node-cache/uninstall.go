//go:build linux

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/nodelocaldns/nodelocaldns/internal/kubeclient"
	"github.com/nodelocaldns/nodelocaldns/nodelocal"
	"github.com/nodelocaldns/nodelocaldns/plugin/notrack"
)

// A cache that stops with no successor hands the node to the cluster DNS and leaves the rest for the next
// cache; after an uninstall no cache comes. Told its DaemonSet (-daemonset), node-cache watches it from the
// start, and a deletion of it (a DELETE event, a deletionTimestamp, or its absence from a new list) is an
// uninstall: the cache then removes everything at exit (notrack.SetUninstalling), and so does the guard
// after a dead cache. An established watch keeps delivering while the RBAC objects of the uninstall go too,
// which a question asked at SIGTERM could not count on. Without an answer from the API (unreachable,
// refused) a stop is a restart, as without -daemonset.

// uninstallFlags are the flags of the uninstall detection, for the cache and the guard alike.
type uninstallFlags struct {
	daemonSet  string
	kubeconfig string
}

func registerUninstallFlags(fs *flag.FlagSet) *uninstallFlags {
	u := &uninstallFlags{}
	fs.StringVar(&u.daemonSet, "daemonset", "", "NAMESPACE/NAME of the DaemonSet this Pod belongs to, watched through the Kubernetes API: once it is deleted (an uninstall) "+
		"the cache removes everything from the node at exit instead of handing it over, and so does the guard after a dead cache; "+
		"while it exists, or the API does not say, a stop is a restart; empty (the default, and outside Kubernetes) turns this off; not an upstream flag")
	fs.StringVar(&u.kubeconfig, "kubeconfig", "", "kubeconfig for -daemonset and for the -upstreamsvc Service's ClusterIP of a family its variable does not name (dual-stack); default the Pod's ServiceAccount; not an upstream flag")
	return u
}

// Bounds of the uninstall detection.
const (
	// dsWatchStopTimeout bounds the wait for the informer to return when the watch stops.
	dsWatchStopTimeout = 10 * time.Second
	// guardUninstallTimeout bounds the guard's wait for the cache to let go of the node at the exit of an
	// uninstall; guardUninstallPoll is how often it tries.
	guardUninstallTimeout = 20 * time.Second
	guardUninstallPoll    = 100 * time.Millisecond
)

// dsUserAgent names the watch's requests to the API server.
const dsUserAgent = "nodelocaldns-node-cache"

// daemonSets is the resource watched: the metadata of apps/v1 DaemonSets is all it needs.
var daemonSets = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "daemonsets"}

// parseDaemonSet splits -daemonset into its namespace and name.
func parseDaemonSet(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok {
		return "", "", fmt.Errorf("-daemonset %q: want NAMESPACE/NAME", s)
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return "", "", fmt.Errorf("-daemonset %q: namespace: %s", s, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", "", fmt.Errorf("-daemonset %q: name: %s", s, strings.Join(errs, "; "))
	}
	return namespace, name, nil
}

// startUninstallWatch starts the watch -daemonset asks for, telling onChange (when not nil) each change of
// whether this is an uninstall. It returns nil when -daemonset is empty, and a watch that never says
// uninstall when there is no API to ask (logged).
func startUninstallWatch(u *uninstallFlags, onChange func(uninstalling bool)) (*daemonSetWatch, error) {
	if u.daemonSet == "" {
		return nil, nil
	}
	namespace, name, err := parseDaemonSet(u.daemonSet)
	if err != nil {
		return nil, err
	}
	rc, reason, err := kubeclient.Config(u.kubeconfig, dsUserAgent)
	if err != nil {
		return nil, fmt.Errorf("-daemonset: %w", err)
	}
	w := &daemonSetWatch{namespace: namespace, name: name, onChange: onChange}
	if rc == nil {
		log.Warningf("-daemonset %s: %s; a stop is taken for a restart: the node is handed over, and an uninstall leaves it so (node-cache -cleanup removes what is left)", w, reason)
		return w, nil
	}
	if err := w.start(rc); err != nil {
		return nil, fmt.Errorf("-daemonset: %w", err)
	}
	return w, nil
}

// daemonSetWatch follows one DaemonSet through the API and says whether it is gone.
type daemonSetWatch struct {
	namespace, name string
	onChange        func(uninstalling bool)
	client          metadata.ResourceInterface

	mu sync.Mutex
	// known is set once the API said whether the DaemonSet exists; gone says whether it is deleted or
	// being deleted, why how the watch learnt it.
	known, gone bool
	why         string
	// resourceVersion is that of the newest version of the DaemonSet seen.
	resourceVersion string
	// failure is the kind of the last failure logged ("refused", "unreachable"), empty while the API answers;
	// err is the last failure.
	failure string
	err     error

	cancel context.CancelFunc
	done   chan struct{}
}

func (w *daemonSetWatch) String() string { return w.namespace + "/" + w.name }

// decision says whether a stop now is an uninstall, and why.
func (w *daemonSetWatch) decision() (uninstall bool, why string) {
	if w == nil {
		return false, "no -daemonset"
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.gone:
		return true, fmt.Sprintf("DaemonSet %s %s", w, w.why)
	case w.known:
		return false, fmt.Sprintf("DaemonSet %s exists", w)
	case w.err != nil:
		return false, fmt.Sprintf("no answer from the Kubernetes API about DaemonSet %s: %v", w, w.err)
	}
	return false, fmt.Sprintf("no answer from the Kubernetes API about DaemonSet %s yet", w)
}

// seen returns the resourceVersion of the newest version of the DaemonSet the watch has seen, and the last
// failure to reach the API (nil once it answers again).
func (w *daemonSetWatch) seen() (resourceVersion string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.resourceVersion, w.err
}

// set records what the API said about the DaemonSet, and tells onChange when that changes the decision.
func (w *daemonSetWatch) set(gone bool, why, resourceVersion string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if resourceVersion != "" {
		w.resourceVersion = resourceVersion
	}
	first, changed := !w.known, w.gone != gone
	w.known, w.gone, w.why = true, gone, why
	switch {
	case gone && (first || changed):
		log.Warningf("DaemonSet %s %s: this is an uninstall; at exit the cache removes everything from the node instead of handing it over, and the guard what a dead cache left", w, why)
	case !gone && changed:
		log.Infof("DaemonSet %s exists again: a stop hands the node over again", w)
	case !gone && first:
		log.Infof("watching DaemonSet %s: while it exists a stop hands the node over; once it is deleted, an uninstall removes everything", w)
	}
	if (first || changed) && w.onChange != nil {
		w.onChange(gone)
	}
}

// observe takes in a version of the DaemonSet: one with a deletionTimestamp is being deleted (a foreground
// deletion, or finalizers), which is an uninstall as much as a deletion is.
func (w *daemonSetWatch) observe(obj any) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok || m.Name != w.name || m.Namespace != w.namespace {
		return
	}
	if m.DeletionTimestamp != nil {
		w.set(true, "is being deleted", m.ResourceVersion)
		return
	}
	w.set(false, "", m.ResourceVersion)
}

// forget takes in a deletion: a DELETE event, or a new list without the DaemonSet.
func (w *daemonSetWatch) forget(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	rv := ""
	if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
		if m.Name != w.name || m.Namespace != w.namespace {
			return
		}
		rv = m.ResourceVersion
	}
	w.set(true, "was deleted", rv)
}

// result records the outcome of a list or watch request: a failure is logged once per kind until the API
// answers again. Once the DaemonSet is gone nothing of it matters: an uninstall deletes the RBAC objects too.
func (w *daemonSetWatch) result(err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		if w.failure != "" {
			log.Infof("the Kubernetes API answers again: watching DaemonSet %s", w)
		}
		w.failure, w.err = "", nil
		return
	}
	w.err = err
	if w.gone {
		return
	}
	kind, what := "unreachable", "the Kubernetes API does not answer"
	if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
		kind, what = "refused", fmt.Sprintf("the Kubernetes API refuses (the ServiceAccount needs list and watch on daemonsets %s in %s, in the apps group)", w.name, w.namespace)
	}
	if kind == w.failure {
		return
	}
	w.failure = kind
	log.Warningf("cannot watch DaemonSet %s: %s: %v; until it can, a stop is taken for a restart: the node is handed over, and an uninstall leaves it so (node-cache -cleanup removes what is left)", w, what, err)
}

// start runs an informer on the one DaemonSet's metadata until stop: it lists and watches with a field
// selector on the name, reconnects with backoff and lists again when the watch expires.
func (w *daemonSetWatch) start(rc *rest.Config) error {
	mc, err := metadata.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("creating the Kubernetes metadata client: %w", err)
	}
	w.client = mc.Resource(daemonSets).Namespace(w.namespace)
	selector := fields.OneTermEqualSelector("metadata.name", w.name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = selector
			list, err := w.client.List(ctx, opts)
			w.result(err)
			if err != nil {
				return nil, err
			}
			return list, nil
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector
			wi, err := w.client.Watch(ctx, opts)
			w.result(err)
			return wi, err
		},
	}
	store, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: cache.ToListWatcherWithWatchListSemantics(lw, mc),
		ObjectType:    &metav1.PartialObjectMetadata{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    w.observe,
			UpdateFunc: func(_, obj any) { w.observe(obj) },
			DeleteFunc: w.forget,
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go func() {
		defer close(w.done)
		informer.RunWithContext(ctx)
	}()
	go func() {
		// The first list (or watch-list) without the DaemonSet delivers no event: it does not exist.
		if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
			return
		}
		if _, exists, err := store.GetByKey(w.namespace + "/" + w.name); err == nil && !exists {
			w.mu.Lock()
			known := w.known
			w.mu.Unlock()
			if !known {
				w.set(true, "does not exist", "")
			}
		}
	}()
	return nil
}

// stop ends the informer and waits for it, a bounded time.
func (w *daemonSetWatch) stop() {
	if w == nil || w.cancel == nil {
		return
	}
	w.cancel()
	select {
	case <-w.done:
	case <-time.After(dsWatchStopTimeout):
		log.Warningf("the watch of DaemonSet %s did not stop within %v", w, dsWatchStopTimeout)
	}
}

// watchForUninstall starts the cache's watch: its decision goes to notrack, which acts on it at the final
// shutdown.
func watchForUninstall(u *uninstallFlags) error {
	_, err := startUninstallWatch(u, notrack.SetUninstalling)
	return err
}

// cleanUpAfterUninstall is the guard's part of an uninstall, at its exit: what a cache left on the node (a
// cache that died, and whose node the guard failed open, or one killed before it was done) goes with
// nodelocal.Cleanup, once the cache has let go of the node lock, within guardUninstallTimeout. A cache that
// still runs removes everything itself.
func cleanUpAfterUninstall(cfg nodelocal.Config, why string) error {
	ctx, cancel := context.WithTimeout(context.Background(), guardUninstallTimeout)
	defer cancel()
	start := time.Now()
	t := time.NewTicker(guardUninstallPoll)
	defer t.Stop()
	logged := false
	for {
		err := nodelocal.Cleanup(ctx, cfg)
		if err == nil {
			log.Infof("nodelocal guard: %s: an uninstall; removed what was left of the cache's on the node in %v", why, time.Since(start).Round(time.Millisecond))
			return nil
		}
		if nodelocal.KindOf(err) != nodelocal.KindNodeLock {
			return fmt.Errorf("%s: an uninstall, but removing what is left on the node failed (node-cache -cleanup removes it): %w", why, err)
		}
		if !logged {
			log.Infof("nodelocal guard: %s: an uninstall; waiting for the cache to let go of the node, then removing what it left", why)
			logged = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: an uninstall, but the cache still holds the node after %v: leaving the node to it (node-cache -cleanup removes what is left): %w",
				why, guardUninstallTimeout, err)
		case <-t.C:
		}
	}
}
