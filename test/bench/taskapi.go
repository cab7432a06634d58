package main

import (
	"context"
	"encoding/json"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
)

// taskClient calls containerd's own Tasks.Update, the call behind
// `ctr task update` in containerd releases that have it and behind
// `nerdctl update`. The request is encoded by hand (two fields and an Any)
// so that the benchmark needs no containerd client module.
type taskClient struct {
	conn *grpc.ClientConn
	ns   string
}

// rawCodec passes pre-encoded protobuf bytes through gRPC.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append((*(v.(*[]byte)))[:0], data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

func dialTasks(socket, namespace string) (*taskClient, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &taskClient{conn: conn, ns: namespace}, nil
}

// linuxResourcesURL is how containerd names an OCI LinuxResources in an Any
// (its typeurl registration; the value is JSON).
const linuxResourcesURL = "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources"

// updateCPU sets the task's cpu.max through containerd, shim and runc.
func (t *taskClient) updateCPU(ctx context.Context, id string, quota int64, period uint64) error {
	res, err := json.Marshal(map[string]any{"cpu": map[string]any{"quota": quota, "period": period}})
	if err != nil {
		return err
	}
	var anyMsg []byte
	anyMsg = protowire.AppendTag(anyMsg, 1, protowire.BytesType)
	anyMsg = protowire.AppendString(anyMsg, linuxResourcesURL)
	anyMsg = protowire.AppendTag(anyMsg, 2, protowire.BytesType)
	anyMsg = protowire.AppendBytes(anyMsg, res)
	var req []byte
	req = protowire.AppendTag(req, 1, protowire.BytesType) // container_id
	req = protowire.AppendString(req, id)
	req = protowire.AppendTag(req, 2, protowire.BytesType) // resources
	req = protowire.AppendBytes(req, anyMsg)
	ctx = metadata.AppendToOutgoingContext(ctx, "containerd-namespace", t.ns)
	var resp []byte
	if err := t.conn.Invoke(ctx, "/containerd.services.tasks.v1.Tasks/Update", &req, &resp, grpc.ForceCodec(rawCodec{})); err != nil {
		return fmt.Errorf("containerd Tasks.Update %s: %w", id, err)
	}
	return nil
}

func (t *taskClient) close() error { return t.conn.Close() }
