// Command cdi-validate checks CDI spec files with the reference CDI library
// (tags.cncf.io/container-device-interface, at the version containerd in the bed links), doing what a
// runtime does with them: each file is read and validated as a spec directory scan loads it, and each
// of its devices is looked up by qualified name in a CDI cache over the directory and injected into an
// empty OCI spec, as containerd's CDI injection does. The unit suite checks every spec the driver
// writes with it (unit_tests/conftest.py, e2e/testbed/cdicheck.py), so one process checks many files.
//
//	cdi-validate PATH...                 a directory is a runtime's spec directory; a file is checked alone
//	cdi-validate -                       the paths come from stdin, one a line
//	cdi-validate -inject ID,ID... DIR    also inject these devices together and print the OCI spec
//
// Output: one JSON line per spec file and per device of a loaded spec, then the injection's line.
// Exit status 0 when everything is ok, 1 when anything is not, 2 for a usage error.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// Injection statuses of a device line.
const (
	injected = "ok"
	// The library looks up, on this machine, every device node a spec does not fully describe (type and
	// major number): where such a node is absent, injection depends on the host, not on the spec.
	needsHostDevices = "needs-host-devices"
	injectFailed     = "error"
)

type specLine struct {
	Spec           string `json:"spec"`
	OK             bool   `json:"ok"`
	Error          string `json:"error,omitempty"`
	Kind           string `json:"kind,omitempty"`
	CDIVersion     string `json:"cdiVersion,omitempty"`
	MinimumVersion string `json:"minimumVersion,omitempty"`
}

type deviceLine struct {
	Spec              string   `json:"spec"`
	Device            string   `json:"device"`
	OK                bool     `json:"ok"`
	Error             string   `json:"error,omitempty"`
	Injected          string   `json:"injected,omitempty"`
	AbsentHostDevices []string `json:"absentHostDevices,omitempty"`
}

type injectLine struct {
	Inject     []string  `json:"inject"`
	OK         bool      `json:"ok"`
	Error      string    `json:"error,omitempty"`
	Unresolved []string  `json:"unresolved,omitempty"`
	OCI        *oci.Spec `json:"oci,omitempty"`
}

type checker struct {
	out *json.Encoder
	ok  bool
}

func (c *checker) emit(ok bool, line any) {
	c.ok = c.ok && ok
	if err := c.out.Encode(line); err != nil {
		fmt.Fprintf(os.Stderr, "cdi-validate: writing the result: %v\n", err)
		os.Exit(2)
	}
}

// newCache is a runtime's view of one spec directory; refreshed once, never watched.
func newCache(dir string) (*cdi.Cache, error) {
	return cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
}

// specFiles lists what a spec directory scan reads: .json and .yaml files, no subdirectories.
func specFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".json" || ext == ".yaml") {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	return files, nil
}

// checkDir checks every spec file of a directory against one cache over it, as a runtime sees them.
func (c *checker) checkDir(dir string) *cdi.Cache {
	files, err := specFiles(dir)
	if err != nil {
		c.emit(false, specLine{Spec: dir, Error: err.Error()})
		return nil
	}
	cache, err := newCache(dir)
	if err != nil {
		c.emit(false, specLine{Spec: dir, Error: err.Error()})
		return nil
	}
	for _, file := range files {
		c.checkSpec(file, file, cache)
	}
	return cache
}

// checkFile checks one file alone: a copy in a directory of its own is what the cache sees, so that
// specs beside it take no part.
func (c *checker) checkFile(path string) {
	if ext := filepath.Ext(path); ext != ".json" && ext != ".yaml" {
		c.emit(false, specLine{Spec: path, Error: "a runtime never loads this file: a CDI spec file name ends in .json or .yaml"})
		return
	}
	data, err := os.ReadFile(path)
	if err != nil {
		c.emit(false, specLine{Spec: path, Error: err.Error()})
		return
	}
	dir, err := os.MkdirTemp("", "cdi-validate-")
	if err != nil {
		c.emit(false, specLine{Spec: path, Error: err.Error()})
		return
	}
	defer os.RemoveAll(dir)
	copied := filepath.Join(dir, filepath.Base(path))
	if err := os.WriteFile(copied, data, 0o644); err != nil {
		c.emit(false, specLine{Spec: path, Error: err.Error()})
		return
	}
	cache, err := newCache(dir)
	if err != nil {
		c.emit(false, specLine{Spec: path, Error: err.Error()})
		return
	}
	c.checkSpec(path, copied, cache)
}

// checkSpec reads one spec as the cache's scan does (cdi.ReadSpec: strict parsing, the version
// check with the minimum version for the features used, vendor, class, annotation and device name
// syntax, container edits), then resolves and injects each of its devices through the cache.
// shown is the path reported, loaded the one the cache read.
func (c *checker) checkSpec(shown, loaded string, cache *cdi.Cache) {
	spec, err := cdi.ReadSpec(loaded, 0)
	if err != nil {
		c.emit(false, specLine{Spec: shown, Error: strings.ReplaceAll(err.Error(), loaded, shown)})
		return
	}
	minimum, err := cdi.MinimumRequiredVersion(spec.Spec)
	if err != nil {
		c.emit(false, specLine{Spec: shown, Error: err.Error()})
		return
	}
	c.emit(true, specLine{Spec: shown, OK: true, Kind: spec.Kind, CDIVersion: spec.Version, MinimumVersion: minimum})
	for _, d := range spec.Devices {
		c.emit(checkDevice(shown, loaded, spec, d.Name, cache))
	}
}

func checkDevice(shown, loaded string, spec *cdi.Spec, name string, cache *cdi.Cache) (bool, deviceLine) {
	qualified := parser.QualifiedName(spec.GetVendor(), spec.GetClass(), name)
	line := deviceLine{Spec: shown, Device: qualified}
	if _, _, _, err := parser.ParseQualifiedName(qualified); err != nil {
		line.Error = err.Error()
		return false, line
	}
	device := cache.GetDevice(qualified)
	if device == nil {
		// A device that two specs of equal priority define is dropped from the cache.
		problems := []string{fmt.Sprintf("unresolvable CDI device %s", qualified)}
		for _, e := range cache.GetErrors()[filepath.Clean(loaded)] {
			problems = append(problems, e.Error())
		}
		line.Error = strings.ReplaceAll(strings.Join(problems, "; "), loaded, shown)
		return false, line
	}
	if _, err := cache.InjectDevices(&oci.Spec{}, qualified); err != nil {
		if absent := absentHostDevices(spec, device); len(absent) > 0 {
			line.OK, line.Injected, line.AbsentHostDevices = true, needsHostDevices, absent
			return true, line
		}
		line.Injected, line.Error = injectFailed, err.Error()
		return false, line
	}
	line.OK, line.Injected = true, injected
	return true, line
}

// absentHostDevices lists the host paths of the device nodes that injecting this device has to look
// up on this machine (the spec gives no type and major number) and that are not device nodes here.
func absentHostDevices(spec *cdi.Spec, device *cdi.Device) []string {
	nodes := append(append([]*specs.DeviceNode{}, spec.ContainerEdits.DeviceNodes...), device.ContainerEdits.DeviceNodes...)
	var absent []string
	for _, n := range nodes {
		if n.Type != "" && (n.Major != 0 || n.Type == "p") {
			continue
		}
		host := n.HostPath
		if host == "" {
			host = n.Path
		}
		info, err := os.Lstat(host)
		if err != nil || info.Mode()&(fs.ModeDevice|fs.ModeNamedPipe) == 0 {
			absent = append(absent, host)
		}
	}
	return absent
}

// inject injects the devices together into an empty OCI spec, as containerd does for one container.
func (c *checker) inject(cache *cdi.Cache, devices []string) {
	line := injectLine{Inject: devices}
	spec := &oci.Spec{}
	unresolved, err := cache.InjectDevices(spec, devices...)
	if err != nil {
		line.Error, line.Unresolved = err.Error(), unresolved
		c.emit(false, line)
		return
	}
	line.OK, line.OCI = true, spec
	c.emit(true, line)
}

func readPaths(args []string) ([]string, error) {
	if len(args) != 1 || args[0] != "-" {
		return args, nil
	}
	var paths []string
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for scanner.Scan() {
		if line := strings.TrimSpace(scanner.Text()); line != "" {
			paths = append(paths, line)
		}
	}
	return paths, scanner.Err()
}

func usage(msg string) {
	fmt.Fprintf(os.Stderr, "cdi-validate: %s\nusage: cdi-validate [-inject ID,ID...] PATH... | -\n", msg)
	os.Exit(2)
}

func main() {
	injectIDs := flag.String("inject", "", "comma-separated qualified device names to inject together (one directory PATH)")
	flag.Parse()
	paths, err := readPaths(flag.Args())
	if err != nil {
		usage(fmt.Sprintf("reading paths from stdin: %v", err))
	}
	if len(paths) == 0 {
		usage("no spec file or directory given")
	}
	var devices []string
	if *injectIDs != "" {
		devices = strings.Split(*injectIDs, ",")
		if len(paths) != 1 {
			usage("-inject takes exactly one spec directory")
		}
	}
	out := bufio.NewWriter(os.Stdout)
	c := &checker{out: json.NewEncoder(out), ok: true}
	for _, path := range paths {
		info, err := os.Stat(path)
		switch {
		case err != nil:
			c.emit(false, specLine{Spec: path, Error: err.Error()})
		case info.IsDir():
			cache := c.checkDir(path)
			if devices != nil && cache != nil {
				c.inject(cache, devices)
			}
		case devices != nil:
			usage("-inject takes a spec directory, not a file")
		default:
			c.checkFile(path)
		}
	}
	if err := out.Flush(); err != nil {
		fmt.Fprintf(os.Stderr, "cdi-validate: writing the result: %v\n", err)
		os.Exit(2)
	}
	if !c.ok {
		os.Exit(1)
	}
}
