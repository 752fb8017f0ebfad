//go:build linux

package conformance

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	manifests "github.com/nodelocaldns/nodelocaldns/examples/kubernetes"
	"github.com/nodelocaldns/nodelocaldns/test/simnode"
)

// strict is how every object is created: a field the API does not know fails the test.
var strict = metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}

// createSystemObjects creates what a kubeadm cluster with the node cache holds for DNS: CoreDNS's
// ServiceAccount and ClusterRole, the cluster-DNS Pod, the Services kube-dns and (the manifest's)
// kube-dns-upstream on the ClusterIPs the simulated kube-proxy DNATs, their EndpointSlices, and the test's
// namespace.
func (r *rig) createSystemObjects() {
	r.t.Helper()
	ctx := context.Background()
	must := func(what string, err error) {
		r.t.Helper()
		if err != nil {
			r.t.Fatalf("creating %s: %v", what, err)
		}
	}
	_, err := r.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}, strict)
	must("namespace "+testNamespace, err)
	// The ServiceAccount controller's "default" of each namespace, which admission requires of a Pod.
	for _, ns := range []string{"kube-system", testNamespace} {
		_, err = r.admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, strict)
		must("ServiceAccount "+ns+"/default", err)
	}
	_, err = r.admin.CoreV1().ServiceAccounts("kube-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "coredns"}}, strict)
	must("ServiceAccount coredns", err)
	// The rules of CoreDNS's own deployment (and kubeadm's) for the kubernetes plugin.
	_, err = r.admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
		},
	}, strict)
	must("ClusterRole system:coredns", err)
	_, err = r.admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:coredns"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "coredns", Namespace: "kube-system"}},
	}, strict)
	must("ClusterRoleBinding system:coredns", err)

	dnsPod := r.createPod("kube-system", "coredns-0", map[string]string{"k8s-app": "kube-dns"}, "", "", simnode.ClusterDNSPodIP)
	dnsPorts := []corev1.ServicePort{
		{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(53)},
		{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(53)},
	}
	kubeDNS := r.createService(&corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec:       corev1.ServiceSpec{ClusterIP: simnode.KubeDNSClusterIP, Selector: map[string]string{"k8s-app": "kube-dns"}, Ports: dnsPorts},
	})
	r.syncEndpointSlice(kubeDNS, dnsPod)
	objs, err := manifests.Load(manifests.Manifests[0].File)
	if err != nil {
		r.t.Fatal(err)
	}
	for _, svc := range objs.Services {
		if svc.Name != "kube-dns-upstream" {
			continue
		}
		svc = svc.DeepCopy()
		svc.Spec.ClusterIP = simnode.UpstreamClusterIP
		r.syncEndpointSlice(r.createService(svc), dnsPod)
	}
}

// token returns a TokenRequest token of the ServiceAccount.
func (r *rig) token(namespace, name string) string {
	r.t.Helper()
	tr, err := r.admin.CoreV1().ServiceAccounts(namespace).CreateToken(context.Background(), name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		r.t.Fatalf("a token of ServiceAccount %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// createPod creates a running, ready Pod with ip, hostname and subdomain, and sets its status as the kubelet
// would once its sandbox has that IP.
func (r *rig) createPod(namespace, name string, podLabels map[string]string, hostname, subdomain, ip string) *corev1.Pod {
	r.t.Helper()
	ctx := context.Background()
	pod, err := r.admin.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: podLabels},
		Spec: corev1.PodSpec{
			Hostname: hostname, Subdomain: subdomain, NodeName: "simnode",
			Containers: []corev1.Container{{Name: "querier", Image: "registry.k8s.io/e2e-test-images/agnhost:2.53"}},
			// No token volume: nothing in the simulated Pod reads one.
			AutomountServiceAccountToken: new(false),
		},
	}, strict)
	if err != nil {
		r.t.Fatalf("creating Pod %s/%s: %v", namespace, name, err)
	}
	now := metav1.Now()
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, HostIP: "192.0.2.1", StartTime: &now,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}},
	}
	if pod, err = r.admin.CoreV1().Pods(namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		r.t.Fatalf("setting the status of Pod %s/%s: %v", namespace, name, err)
	}
	return pod
}

// createService creates svc and returns it as the API stored it (with its ClusterIP).
func (r *rig) createService(svc *corev1.Service) *corev1.Service {
	r.t.Helper()
	if svc.Namespace == "" {
		svc.Namespace = testNamespace
	}
	got, err := r.admin.CoreV1().Services(svc.Namespace).Create(context.Background(), svc, strict)
	if err != nil {
		r.t.Fatalf("creating Service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return got
}

// syncEndpointSlice writes the EndpointSlice the EndpointSlice controller keeps for svc from pods: those the
// selector matches, ready, each with its Pod IP, its hostname when its subdomain names the Service, a
// reference to it and its node; the ports are the Service's, at their target ports.
func (r *rig) syncEndpointSlice(svc *corev1.Service, pods ...*corev1.Pod) {
	r.t.Helper()
	selector := labels.SelectorFromSet(svc.Spec.Selector)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      svc.Name + "-sim",
			Namespace: svc.Namespace,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: svc.Name,
				discoveryv1.LabelManagedBy:   "endpointslice-controller.k8s.io",
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID,
				Controller: new(true), BlockOwnerDeletion: new(true)}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range svc.Spec.Ports {
		port := p.TargetPort.IntVal
		if p.TargetPort.Type == intstr.String || port == 0 {
			port = p.Port
		}
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: new(p.Name), Port: new(port), Protocol: new(p.Protocol)})
	}
	for _, pod := range pods {
		if pod.Namespace != svc.Namespace || !selector.Matches(labels.Set(pod.Labels)) {
			continue
		}
		ep := discoveryv1.Endpoint{
			Addresses:  []string{pod.Status.PodIP},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(false)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
			NodeName:   new(pod.Spec.NodeName),
		}
		if pod.Spec.Hostname != "" && pod.Spec.Subdomain == svc.Name {
			ep.Hostname = new(pod.Spec.Hostname)
		}
		slice.Endpoints = append(slice.Endpoints, ep)
	}
	if _, err := r.admin.DiscoveryV1().EndpointSlices(svc.Namespace).Create(context.Background(), slice, strict); err != nil {
		r.t.Fatalf("creating the EndpointSlice of Service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
}

// updateService changes the Service through the API, as e2eservice.UpdateService does.
func (r *rig) updateService(name string, change func(*corev1.Service)) *corev1.Service {
	r.t.Helper()
	ctx := context.Background()
	svc, err := r.admin.CoreV1().Services(testNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	change(svc)
	if svc, err = r.admin.CoreV1().Services(testNamespace).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		r.t.Fatalf("updating Service %s: %v", name, err)
	}
	return svc
}

// setKubeDNSConfigMap creates, replaces or (data nil) deletes the kube-dns ConfigMap through the API, and
// projects what the API then holds into the node cache's volume, as the kubelet's sync of the volume does.
func (r *rig) setKubeDNSConfigMap(data map[string]string) {
	r.t.Helper()
	ctx := context.Background()
	cms := r.admin.CoreV1().ConfigMaps("kube-system")
	cm, err := cms.Get(ctx, "kube-dns", metav1.GetOptions{})
	exists := err == nil
	switch {
	case data == nil && exists:
		err = cms.Delete(ctx, "kube-dns", metav1.DeleteOptions{})
	case data == nil:
		err = nil
	case exists:
		cm.Data = data
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	default:
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: "kube-system"}, Data: data}, strict)
	}
	if err != nil {
		r.t.Fatalf("setting the kube-dns ConfigMap to %v: %v", data, err)
	}
	projected := map[string]string{}
	if got, err := cms.Get(ctx, "kube-dns", metav1.GetOptions{}); err == nil {
		projected = got.Data
	} else if data != nil {
		r.t.Fatalf("reading the kube-dns ConfigMap back: %v", err)
	}
	if err := r.kubeDNS.Project(projected); err != nil {
		r.t.Fatal(err)
	}
}

// fqdn is name in the test's namespace's Service domain.
func fqdn(name string) string { return fmt.Sprintf("%s.%s.svc.cluster.local", name, testNamespace) }
