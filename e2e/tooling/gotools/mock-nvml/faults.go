package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// parseFaults reads DRA_MOCK_NVML_FAIL: NAME=CODE pairs, comma-separated; NAME is an NVML function
// this library exports and CODE the nvmlReturn_t it should return instead of doing anything.
func parseFaults(text string) (map[string]nvml.Return, error) {
	faults := map[string]nvml.Return{}
	for _, item := range strings.Split(text, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, code, found := strings.Cut(item, "=")
		value, err := strconv.Atoi(strings.TrimSpace(code))
		if !found || !strings.HasPrefix(name, "nvml") || err != nil || value <= 0 {
			return nil, fmt.Errorf("DRA_MOCK_NVML_FAIL: %q is not NVML_FUNCTION=CODE with a non-zero nvmlReturn_t CODE", item)
		}
		faults[strings.TrimSpace(name)] = nvml.Return(value)
	}
	return faults, nil
}
