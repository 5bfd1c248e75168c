// CoreDNS for the kind node image (e2e/testbed/kindnode.py), with only the plugins that kubeadm's
// default Corefile names: upstream's own main imports every plugin (cloud DNS, etcd, geoip, ...),
// which triples the build and its dependencies for nothing a cluster's DNS uses.
package main

import (
	"github.com/coredns/coredns/coremain"

	// The plugins of kubeadm's Corefile (cmd/kubeadm/app/phases/addons/dns/manifests.go).
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	coremain.Run()
}
