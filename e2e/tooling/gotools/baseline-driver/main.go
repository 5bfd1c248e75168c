// Command baseline-driver is the benchmark's yardstick: a minimal DRA node plugin on the upstream
// kubeletplugin helper, doing the same durable work per claim as ours (a CDI spec with the same
// device nodes, and a checkpoint, each written atomically) so that e2e/bench/realnode.py can report
// our Prepare/Unprepare latency and memory as ratios to it, measured in one run on one kubelet.
// It publishes simulated GPUs only and is used by nothing but the benchmark. Its grpc-floor
// command (floor.go) measures a no-op call's round trip for e2e/bench/floor.py.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

var controlNodes = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}

// A claim UID goes into file names: nothing but a UID may.
var uidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

type settings struct {
	driverName, nodeName, kubeconfig         string
	registryDir, pluginDir, cdiRoot, devRoot string
	stateDir                                 string
	devices                                  int
}

type preparedDevice struct {
	Request string `json:"request"`
	Device  string `json:"device"`
	CDIID   string `json:"cdiID"`
}

type checkpoint struct {
	Checksum string                      `json:"checksum"`
	Claims   map[string][]preparedDevice `json:"claims"`
}

type driver struct {
	s        settings
	mu       sync.Mutex
	prepared map[string][]preparedDevice
}

func (d *driver) kind() string { return d.s.driverName + "/gpu" }

func (d *driver) node(name string) map[string]string {
	return map[string]string{"path": "/dev/" + name, "hostPath": filepath.Join(d.s.devRoot, "dev", name)}
}

func (d *driver) specPath(uid string) string {
	return filepath.Join(d.s.cdiRoot, d.s.driverName+"-claim_"+uid+".json")
}

// writeAtomically: temp file, fsync, rename, fsync of the folder; a crash leaves old or new, never half.
func writeAtomically(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}

func (d *driver) saveCheckpoint() error {
	body, err := json.Marshal(d.prepared)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(body)
	data, err := json.Marshal(checkpoint{Checksum: hex.EncodeToString(sum[:]), Claims: d.prepared})
	if err != nil {
		return err
	}
	return writeAtomically(filepath.Join(d.s.stateDir, "checkpoint.json"), data)
}

func (d *driver) loadCheckpoint() error {
	data, err := os.ReadFile(filepath.Join(d.s.stateDir, "checkpoint.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var cp checkpoint
	if err := json.Unmarshal(data, &cp); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	body, err := json.Marshal(cp.Claims)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(body)
	if hex.EncodeToString(sum[:]) != cp.Checksum {
		return errors.New("checkpoint: checksum mismatch")
	}
	if cp.Claims != nil {
		d.prepared = cp.Claims
	}
	return nil
}

func (d *driver) prepareOne(claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	uid := string(claim.UID)
	if !uidPattern.MatchString(uid) {
		return nil, fmt.Errorf("claim %s/%s: invalid UID %q", claim.Namespace, claim.Name, uid)
	}
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s: not allocated", claim.Namespace, claim.Name)
	}
	var devs []preparedDevice
	var specDevices []any
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.s.driverName {
			continue
		}
		index, found := strings.CutPrefix(r.Device, "gpu-")
		minor, err := strconv.Atoi(index)
		if !found || err != nil || minor < 0 || minor >= d.s.devices {
			return nil, fmt.Errorf("claim %s/%s: unknown device %q", claim.Namespace, claim.Name, r.Device)
		}
		name := uid + "-" + r.Device
		devs = append(devs, preparedDevice{Request: r.Request, Device: r.Device, CDIID: d.kind() + "=" + name})
		specDevices = append(specDevices, map[string]any{"name": name, "containerEdits": map[string]any{
			"deviceNodes": []any{d.node("nvidia" + strconv.Itoa(minor))},
			"env":         []string{"BASELINE_DEVICE=" + r.Device},
		}})
	}
	var common []any
	for _, n := range controlNodes {
		common = append(common, d.node(n))
	}
	spec, err := json.Marshal(map[string]any{"cdiVersion": "0.5.0", "kind": d.kind(), "devices": specDevices,
		"containerEdits": map[string]any{"deviceNodes": common,
			"env": []string{"BASELINE_CLAIM=" + claim.Namespace + "/" + claim.Name}}})
	if err != nil {
		return nil, err
	}
	if err := writeAtomically(d.specPath(uid), spec); err != nil {
		return nil, fmt.Errorf("claim %s/%s: CDI spec: %w", claim.Namespace, claim.Name, err)
	}
	d.prepared[uid] = devs
	if err := d.saveCheckpoint(); err != nil {
		return nil, fmt.Errorf("claim %s/%s: checkpoint: %w", claim.Namespace, claim.Name, err)
	}
	out := make([]kubeletplugin.Device, 0, len(devs))
	for _, p := range devs {
		out = append(out, kubeletplugin.Device{Requests: []string{p.Request}, PoolName: d.s.nodeName,
			DeviceName: p.Device, CDIDeviceIDs: []string{p.CDIID}})
	}
	return out, nil
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		devices, err := d.prepareOne(claim)
		result[claim.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
	}
	return result, nil
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	result := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		uid := string(claim.UID)
		if !uidPattern.MatchString(uid) {
			result[claim.UID] = fmt.Errorf("claim %s: invalid UID %q", claim.String(), uid)
			continue
		}
		if err := os.Remove(d.specPath(uid)); err != nil && !errors.Is(err, os.ErrNotExist) {
			result[claim.UID] = err
			continue
		}
		delete(d.prepared, uid)
		result[claim.UID] = d.saveCheckpoint()
	}
	return result, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	runtime.HandleErrorWithContext(ctx, err, msg)
}

func (d *driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (d *driver) resources() resourceslice.DriverResources {
	devices := make([]resourceapi.Device, 0, d.s.devices)
	for i := 0; i < d.s.devices; i++ {
		devices = append(devices, resourceapi.Device{
			Name: "gpu-" + strconv.Itoa(i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type":        {StringValue: ptr("gpu")},
				"index":       {IntValue: ptr(int64(i))},
				"minor":       {IntValue: ptr(int64(i))},
				"productName": {StringValue: ptr("NVIDIA H100 80GB HBM3")},
				"uuid":        {StringValue: ptr(fmt.Sprintf("GPU-baseline-%s-%d", d.s.nodeName, i))},
			},
		})
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		d.s.nodeName: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
}

func ptr[T any](v T) *T { return &v }

func run(s settings) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig)
	if err != nil {
		return err
	}
	// The same client rate as ours gets on the bench: client-go's default 5/s would throttle bursts.
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	node, err := client.CoreV1().Nodes().Get(ctx, s.nodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", s.nodeName, err)
	}
	for _, dir := range []string{s.pluginDir, s.cdiRoot, s.stateDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	d := &driver{s: s, prepared: map[string][]preparedDevice{}}
	if err := d.loadCheckpoint(); err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(s.driverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(s.nodeName),
		kubeletplugin.NodeUID(node.UID),
		kubeletplugin.RegistrarDirectoryPath(s.registryDir),
		kubeletplugin.PluginDataDirectoryPath(s.pluginDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return err
	}
	defer helper.Stop()
	if err := helper.PublishResources(ctx, d.resources()); err != nil {
		return err
	}
	klog.InfoS("baseline driver started", "driver", s.driverName, "node", s.nodeName, "devices", s.devices)
	<-ctx.Done()
	return nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "grpc-floor" {
		if err := floor(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "baseline-driver grpc-floor:", err)
			os.Exit(1)
		}
		return
	}
	var s settings
	flag.StringVar(&s.driverName, "driver-name", "baseline.dra-driver.io", "DRA driver name")
	flag.StringVar(&s.nodeName, "node-name", "", "this node's name")
	flag.StringVar(&s.kubeconfig, "kubeconfig", "", "kubeconfig")
	flag.StringVar(&s.registryDir, "kubelet-registry-dir", "/var/lib/kubelet/plugins_registry", "kubelet plugin registry")
	flag.StringVar(&s.pluginDir, "plugin-dir", "", "folder of the DRA socket (default: /var/lib/kubelet/plugins/<driver>)")
	flag.StringVar(&s.cdiRoot, "cdi-root", "/var/run/cdi", "CDI spec folder")
	flag.StringVar(&s.devRoot, "dev-root", "/", "where the simulated /dev nodes live")
	flag.StringVar(&s.stateDir, "state-dir", "", "checkpoint folder")
	flag.IntVar(&s.devices, "devices", 8, "simulated GPUs")
	klog.InitFlags(nil)
	flag.Parse()
	if s.nodeName == "" || s.stateDir == "" || s.devices < 1 {
		fmt.Fprintln(os.Stderr, "baseline-driver: --node-name, --state-dir and --devices >= 1 are required")
		os.Exit(2)
	}
	if s.pluginDir == "" {
		s.pluginDir = filepath.Join("/var/lib/kubelet/plugins", s.driverName)
	}
	if err := run(s); err != nil {
		fmt.Fprintln(os.Stderr, "baseline-driver:", err)
		os.Exit(1)
	}
}
