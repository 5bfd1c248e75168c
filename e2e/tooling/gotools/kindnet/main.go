// kindnetd for the kind node image built offline (e2e/testbed/kindnode.py): what a kind cluster
// needs from its default CNI, and nothing more (kind's own kindnetd also does network policy and
// DNS caching). kind's kindnetd module cannot be pinned here (the module proxy does not serve it).
//
// Every node is on one Docker network, so pods reach each other by plain routes:
//   - this node's conflist: ptp + host-local over node.spec.podCIDRs, portmap for hostPorts;
//   - a route to every other node's pod CIDRs via that node's InternalIP;
//   - masquerade for traffic that leaves the cluster's pod subnet (POD_SUBNET), so pods reach
//     the outside through the node's address.
//
// It polls the API instead of watching: a handful of nodes, and a route or rule put back within
// seconds is all a test cluster needs.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	conflistPath = "/etc/cni/net.d/10-kindnet.conflist"
	interval     = 10 * time.Second
	masqComment  = "kindnet: masquerade traffic leaving the pod subnet"
)

func main() {
	nodeName := os.Getenv("NODE_NAME")
	if nodeName == "" {
		log.Fatal("NODE_NAME is not set (the DaemonSet passes spec.nodeName)")
	}
	podSubnets := splitList(os.Getenv("POD_SUBNET"))
	config, err := rest.InClusterConfig()
	if err != nil {
		log.Fatalf("in-cluster config: %v", err)
	}
	// kind adds the API server's address (host:port on the nodes' network): the Service address
	// in the in-cluster config works only once kube-proxy runs, and kube-proxy waits for the CNI.
	if endpoint := os.Getenv("CONTROL_PLANE_ENDPOINT"); endpoint != "" {
		config.Host = "https://" + endpoint
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		log.Fatalf("client: %v", err)
	}
	mtu := interfaceMTU("eth0")
	log.Printf("kindnetd: node %s, pod subnets %v, mtu %d", nodeName, podSubnets, mtu)
	for {
		if err := reconcile(context.Background(), client, nodeName, podSubnets, mtu); err != nil {
			log.Printf("reconcile: %v", err)
		}
		time.Sleep(interval)
	}
}

func splitList(value string) []string {
	var items []string
	for _, item := range strings.Split(value, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	return items
}

func interfaceMTU(name string) int {
	iface, err := net.InterfaceByName(name)
	if err != nil {
		return 0
	}
	return iface.MTU
}

func reconcile(ctx context.Context, client kubernetes.Interface, nodeName string, podSubnets []string, mtu int) error {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	for i := range nodes.Items {
		node := &nodes.Items[i]
		if node.Name == nodeName {
			if err := writeConflist(podCIDRs(node), mtu); err != nil {
				return err
			}
			continue
		}
		for _, cidr := range podCIDRs(node) {
			if gateway := internalIP(node, isIPv6(cidr)); gateway != "" {
				if err := run("ip", "route", "replace", cidr, "via", gateway); err != nil {
					log.Printf("route to %s (%s) via %s: %v", cidr, node.Name, gateway, err)
				}
			}
		}
	}
	for _, subnet := range podSubnets {
		if err := ensureMasquerade(subnet); err != nil {
			return err
		}
	}
	return nil
}

func podCIDRs(node *corev1.Node) []string {
	if len(node.Spec.PodCIDRs) > 0 {
		return node.Spec.PodCIDRs
	}
	if node.Spec.PodCIDR != "" {
		return []string{node.Spec.PodCIDR}
	}
	return nil
}

func isIPv6(cidr string) bool {
	return strings.Contains(cidr, ":")
}

func internalIP(node *corev1.Node, v6 bool) string {
	for _, address := range node.Status.Addresses {
		if address.Type == corev1.NodeInternalIP && isIPv6(address.Address) == v6 {
			return address.Address
		}
	}
	return ""
}

type conflist struct {
	CNIVersion string           `json:"cniVersion"`
	Name       string           `json:"name"`
	Plugins    []map[string]any `json:"plugins"`
}

func writeConflist(cidrs []string, mtu int) error {
	if len(cidrs) == 0 {
		return nil // the controller-manager has not allocated this node's CIDR yet
	}
	var ranges [][]map[string]string
	var routes []map[string]string
	for _, cidr := range cidrs {
		ranges = append(ranges, []map[string]string{{"subnet": cidr}})
		route := "0.0.0.0/0"
		if isIPv6(cidr) {
			route = "::/0"
		}
		routes = append(routes, map[string]string{"dst": route})
	}
	ptp := map[string]any{
		"type":   "ptp",
		"ipMasq": false,
		"ipam": map[string]any{
			"type": "host-local", "dataDir": "/run/cni-ipam-state", "routes": routes, "ranges": ranges,
		},
	}
	if mtu > 0 {
		ptp["mtu"] = mtu
	}
	portmap := map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}}
	data, err := json.MarshalIndent(conflist{CNIVersion: "0.3.1", Name: "kindnet", Plugins: []map[string]any{ptp, portmap}}, "", "  ")
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(conflistPath); err == nil && bytes.Equal(old, data) {
		return nil
	}
	// A name the CNI loader ignores first, then a rename: containerd never reads half a file.
	tmp := conflistPath + ".temp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	log.Printf("writing %s for %v", conflistPath, cidrs)
	return os.Rename(tmp, conflistPath)
}

func ensureMasquerade(subnet string) error {
	tool := "iptables"
	if isIPv6(subnet) {
		tool = "ip6tables"
	}
	rule := []string{"POSTROUTING", "-s", subnet, "!", "-d", subnet, "-m", "comment", "--comment", masqComment, "-j", "MASQUERADE"}
	if run(tool, append([]string{"-t", "nat", "-C"}, rule...)...) == nil {
		return nil
	}
	return run(tool, append([]string{"-t", "nat", "-A"}, rule...)...)
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
