package main

// The gRPC floor: what one NodePrepareResources round trip costs with nothing behind the handler,
// so that e2e/bench/floor.py can tell the transport's share of a prepare from the driver's work.
//
//	baseline-driver grpc-floor serve SOCKET            answer every call at once, from grpc-go
//	baseline-driver grpc-floor call SOCKET CALLS PAUSE  CALLS calls, one at a time, PAUSE apart (as
//	                                                    a kubelet starting pods one after another),
//	                                                    printing each round trip in microseconds (JSON)

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
)

type floorServer struct {
	drapb.UnimplementedDRAPluginServer
}

// NodePrepareResources answers the device a prepare of ours answers with: one device per claim.
func (floorServer) NodePrepareResources(_ context.Context, req *drapb.NodePrepareResourcesRequest) (*drapb.NodePrepareResourcesResponse, error) {
	out := &drapb.NodePrepareResourcesResponse{Claims: map[string]*drapb.NodePrepareResourceResponse{}}
	for _, c := range req.Claims {
		out.Claims[c.Uid] = &drapb.NodePrepareResourceResponse{Devices: []*drapb.Device{{
			RequestNames: []string{"gpu"}, PoolName: "floor", DeviceName: "gpu-0",
			CdiDeviceIds: []string{"k8s.floor.dra-driver.io/claim=" + c.Uid + "-gpu-0"},
		}}}
	}
	return out, nil
}

func floorServe(socket string) error {
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		return err
	}
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	server := grpc.NewServer()
	drapb.RegisterDRAPluginServer(server, floorServer{})
	fmt.Println("ready")
	return server.Serve(listener)
}

func floorCall(socket string, calls int, pause time.Duration) error {
	conn, err := grpc.NewClient("unix:"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := drapb.NewDRAPluginClient(conn)
	req := &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{
		{Namespace: "floor", Uid: "0b7f6c9e-3f1a-4c43-9d55-2f1e8a9b7c10", Name: "floor"},
	}}
	// The first call connects; it is not a round trip on an open connection, which is what the kubelet makes.
	if _, err := client.NodePrepareResources(context.Background(), req); err != nil {
		return err
	}
	micros := make([]int64, 0, calls)
	for range calls {
		time.Sleep(pause)
		start := time.Now()
		if _, err := client.NodePrepareResources(context.Background(), req); err != nil {
			return err
		}
		micros = append(micros, time.Since(start).Microseconds())
	}
	return json.NewEncoder(os.Stdout).Encode(micros)
}

func floor(args []string) error {
	switch {
	case len(args) == 2 && args[0] == "serve":
		return floorServe(args[1])
	case len(args) == 4 && args[0] == "call":
		calls, err := strconv.Atoi(args[2])
		if err != nil || calls < 1 {
			return fmt.Errorf("CALLS must be a positive number, got %q", args[2])
		}
		pause, err := time.ParseDuration(args[3])
		if err != nil {
			return fmt.Errorf("PAUSE must be a duration (50ms), got %q", args[3])
		}
		return floorCall(args[1], calls, pause)
	}
	return fmt.Errorf("usage: baseline-driver grpc-floor serve SOCKET | call SOCKET CALLS PAUSE")
}
