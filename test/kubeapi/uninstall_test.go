//go:build linux

package kubeapi

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/nodelocaldns/nodelocaldns/internal/helmtest"
	"github.com/nodelocaldns/nodelocaldns/internal/kubeapi"
)

// exitingFinalizer keeps the test's cache Pod in the API after its deletion, as a Pod whose containers are
// still exiting stays until the kubelet has seen them stop.
const exitingFinalizer = "nodelocaldns.test/exiting"

// TestChartUninstallOrder runs `helm install` and `helm uninstall` of the chart against a real API server
// and checks the order the uninstall hook promises: helm deletes nothing before the hook's Job succeeds, the
// Job can delete the DaemonSet and wait for it with its own ServiceAccount's token and nothing more, and the
// kube-dns-upstream Service and the ConfigMap are still there while a cache Pod is exiting. The API server
// runs no controllers, so the test plays them: the Job's container (its arguments, with its ServiceAccount's
// token), the garbage collector (foreground deletion), the kubelet (the Pod's exit) and the Job controller.
func TestChartUninstallOrder(t *testing.T) {
	s := kubeapi.Start(t)
	admin := kubernetes.NewForConfigOrDie(s.AdminConfig())
	ctx := context.Background()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := s.WriteKubeconfig(kubeconfig, s.URL(), adminToken(t, s)); err != nil {
		t.Fatal(err)
	}
	const ns, release = helmtest.Namespace, helmtest.Release
	if out, err := helmtest.Run(t, "install", release, helmtest.ChartDir(t), "--namespace", ns, "--kubeconfig", kubeconfig); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	ds, err := admin.AppsV1().DaemonSets(ns).Get(ctx, release, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A cache Pod of the DaemonSet, as its controller would create it.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: release + "-abcde", Namespace: ns, Labels: ds.Spec.Template.Labels, Finalizers: []string{exitingFinalizer},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID,
				Controller: new(true), BlockOwnerDeletion: new(true)}},
		},
		Spec: ds.Spec.Template.Spec,
	}
	if _, err := admin.CoreV1().Pods(ns).Create(ctx, pod, strict); err != nil {
		t.Fatalf("creating the cache Pod: %v", err)
	}

	uninstalled := make(chan error, 1)
	go func() {
		out, err := helmtest.Run(t, "uninstall", release, "--namespace", ns, "--kubeconfig", kubeconfig, "--timeout", waitLimit.String())
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, out)
		}
		uninstalled <- err
	}()

	// helm runs the hook first: its Job appears while everything else is still there.
	var job *batchv1.Job
	waitFor(t, "uninstall hook Job", func() bool {
		select {
		case err := <-uninstalled:
			_, svcErr := admin.CoreV1().Services(ns).Get(ctx, "kube-dns-upstream", metav1.GetOptions{})
			t.Fatalf("helm uninstall returned (%v) without a hook Job; kube-dns-upstream: %v, while the cache Pod still exits", err, svcErr)
		default:
		}
		job, err = admin.BatchV1().Jobs(ns).Get(ctx, release+"-uninstall", metav1.GetOptions{})
		return err == nil
	})
	stillThere := func(when string) {
		t.Helper()
		if _, err := admin.CoreV1().Services(ns).Get(ctx, "kube-dns-upstream", metav1.GetOptions{}); err != nil {
			t.Errorf("%s: kube-dns-upstream: %v", when, err)
		}
		if _, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, release, metav1.GetOptions{}); err != nil {
			t.Errorf("%s: the ConfigMap: %v", when, err)
		}
		if _, err := admin.RbacV1().Roles(ns).Get(ctx, release, metav1.GetOptions{}); err != nil {
			t.Errorf("%s: the cache's Role: %v", when, err)
		}
	}
	stillThere("when the hook starts")

	// The Job's container, with its ServiceAccount's token: the DaemonSet deleted in the foreground, then
	// watched until it is gone.
	spec := job.Spec.Template.Spec
	hook := kubernetes.NewForConfigOrDie(s.TokenConfig(serviceAccountTokenOf(t, admin, ns, spec.ServiceAccountName)))
	name, propagation := hookDeletion(t, spec.Containers[0].Args)
	if name != ds.Name || propagation != metav1.DeletePropagationForeground {
		t.Fatalf("the hook deletes %q with propagation %q, want %q in the foreground", name, propagation, ds.Name)
	}
	if err := hook.AppsV1().DaemonSets(ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &propagation}); err != nil {
		t.Fatalf("the hook's ServiceAccount cannot delete the DaemonSet: %v", err)
	}
	gone := make(chan error, 1)
	go func() { gone <- waitDeleted(ctx, hook, ns, name) }()
	if _, err := hook.CoreV1().ConfigMaps(ns).Get(ctx, release, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the hook's ServiceAccount reads a ConfigMap (%v): its Role should grant the DaemonSet only", err)
	}

	// The garbage collector: the DaemonSet is held by the foreground finalizer while its Pod goes.
	ds, err = admin.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil || ds.DeletionTimestamp == nil || !slices.Contains(ds.Finalizers, metav1.FinalizerDeleteDependents) {
		t.Fatalf("DaemonSet after the hook's delete: %v, %+v", err, ds)
	}
	if err := admin.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	stillThere("while the cache Pod exits")
	select {
	case err := <-gone:
		t.Fatalf("the hook stopped waiting while the DaemonSet still exists: %v", err)
	case err := <-uninstalled:
		t.Fatalf("helm uninstall returned while the hook runs: %v", err)
	default:
	}
	// The kubelet: the Pod's containers have exited. Then the garbage collector lets the DaemonSet go.
	removeFinalizer(t, func() error {
		p, err := admin.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Finalizers = slices.DeleteFunc(p.Finalizers, func(f string) bool { return f == exitingFinalizer })
		_, err = admin.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{})
		return err
	})
	stillThere("once the cache Pod is gone, before the hook has succeeded")
	removeFinalizer(t, func() error {
		d, err := admin.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		d.Finalizers = slices.DeleteFunc(d.Finalizers, func(f string) bool { return f == metav1.FinalizerDeleteDependents })
		_, err = admin.AppsV1().DaemonSets(ns).Update(ctx, d, metav1.UpdateOptions{})
		return err
	})
	select {
	case err := <-gone:
		if err != nil {
			t.Fatalf("the hook's wait: %v", err)
		}
	case <-time.After(waitLimit):
		t.Fatal("the hook's wait did not see the DaemonSet go")
	}

	// The Job controller: the container exited 0.
	completeJob(t, admin, ns, job.Name)
	select {
	case err := <-uninstalled:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitLimit):
		t.Fatal("helm uninstall did not return after the hook succeeded")
	}
	if _, err := admin.CoreV1().Services(ns).Get(ctx, "kube-dns-upstream", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("kube-dns-upstream after the uninstall: %v", err)
	}
	if _, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, release, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the ConfigMap after the uninstall: %v", err)
	}
	for _, what := range []struct {
		kind string
		get  func() error
	}{
		{"hook Job", func() error { _, err := admin.BatchV1().Jobs(ns).Get(ctx, job.Name, metav1.GetOptions{}); return err }},
		{"hook Role", func() error { _, err := admin.RbacV1().Roles(ns).Get(ctx, job.Name, metav1.GetOptions{}); return err }},
		{"hook ServiceAccount", func() error {
			_, err := admin.CoreV1().ServiceAccounts(ns).Get(ctx, job.Name, metav1.GetOptions{})
			return err
		}},
	} {
		if err := what.get(); !apierrors.IsNotFound(err) {
			t.Errorf("%s after the uninstall: %v (hook-succeeded deletes it)", what.kind, err)
		}
	}
}

// adminToken is the admin's bearer token, for helm's kubeconfig.
func adminToken(t *testing.T, s *kubeapi.Server) string {
	t.Helper()
	token := s.AdminConfig().BearerToken
	if token == "" {
		t.Fatal("the test API server's admin has no token")
	}
	return token
}

// serviceAccountTokenOf asks the API for a token of an existing ServiceAccount.
func serviceAccountTokenOf(t *testing.T, admin kubernetes.Interface, ns, name string) string {
	t.Helper()
	tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// hookDeletion reads the hook container's kubectl arguments: the DaemonSet it deletes and the propagation.
func hookDeletion(t *testing.T, args []string) (name string, propagation metav1.DeletionPropagation) {
	t.Helper()
	if len(args) < 3 || args[0] != "delete" || args[1] != "daemonset" {
		t.Fatalf("hook arguments %q: want kubectl delete daemonset NAME ...", args)
	}
	name = args[2]
	propagation = metav1.DeletePropagationBackground // kubectl's default
	var waits bool
	for _, a := range args[3:] {
		switch {
		case strings.HasPrefix(a, "--cascade="):
			switch v := strings.TrimPrefix(a, "--cascade="); v {
			case "foreground":
				propagation = metav1.DeletePropagationForeground
			case "orphan":
				propagation = metav1.DeletePropagationOrphan
			}
		case a == "--wait=true" || a == "--wait":
			waits = true
		}
	}
	if !waits {
		t.Fatalf("hook arguments %q: it does not wait for the DaemonSet to go", args)
	}
	return name, propagation
}

// waitDeleted is kubectl's --wait: a watch of the one object until it is deleted.
func waitDeleted(ctx context.Context, c kubernetes.Interface, ns, name string) error {
	ctx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	list, err := c.AppsV1().DaemonSets(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return fmt.Errorf("listing DaemonSet %s: %w", name, err)
	}
	if len(list.Items) == 0 {
		return nil
	}
	w, err := c.AppsV1().DaemonSets(ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		return fmt.Errorf("watching DaemonSet %s: %w", name, err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ev.Type == "DELETED" {
			return nil
		}
	}
	return fmt.Errorf("the watch of DaemonSet %s ended before it was deleted: %w", name, ctx.Err())
}

// removeFinalizer runs an update, again on a conflict.
func removeFinalizer(t *testing.T, update func() error) {
	t.Helper()
	for range 5 {
		err := update()
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
	t.Fatal("five conflicts in a row")
}

// completeJob sets a Job's status as the Job controller does when its one Pod succeeded.
func completeJob(t *testing.T, admin kubernetes.Interface, ns, name string) {
	t.Helper()
	ctx := context.Background()
	job, err := admin.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	start := metav1.NewTime(now.Add(-time.Second))
	job.Status = batchv1.JobStatus{
		StartTime: &start, CompletionTime: &now, Succeeded: 1, Terminating: new(int32(0)), Ready: new(int32(0)),
		UncountedTerminatedPods: &batchv1.UncountedTerminatedPods{},
		Conditions: []batchv1.JobCondition{
			{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
			{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
		},
	}
	if _, err := admin.BatchV1().Jobs(ns).UpdateStatus(ctx, job, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("completing the hook Job: %v", err)
	}
}
