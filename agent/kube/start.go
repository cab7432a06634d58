package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// Config is how the daemon starts the intake (its --kubeconfig,
// --node-name and --kube-intake flags).
type Config struct {
	// Kubeconfig is a kubeconfig file; empty: the in-cluster config (the
	// pod's service account).
	Kubeconfig string
	// NodeName is this node (the DaemonSet passes spec.nodeName through the
	// downward API as $NODE_NAME).
	NodeName string
	// Intake is annotation or off.
	Intake string
	// Predictor foresees the kubelet's verdicts (predict.go); nil: none.
	Predictor Predictor
	Logger    *slog.Logger
	// Companions run beside the intake, with its client, until it stops
	// (the resize latency tracker, agent/kube/latency).
	Companions []func(context.Context, kubernetes.Interface) error
}

// Enabled reports whether the intake is to run: a mode other than off and
// a node name (outside Kubernetes there is none, and the intake stays off).
func (c Config) Enabled() bool {
	m, err := ParseMode(c.Intake)
	return err == nil && m != ModeOff && c.NodeName != ""
}

// Validate checks the configuration without contacting anything.
func (c Config) Validate() error {
	m, err := ParseMode(c.Intake)
	if err != nil {
		return err
	}
	if m != ModeOff && c.NodeName == "" && c.Kubeconfig != "" {
		return errors.New("kubeconfig is set but the node name is not: set --node-name or $NODE_NAME, or --kube-intake=off")
	}
	return nil
}

// RESTConfig is the client configuration: from the kubeconfig file, or
// in-cluster when it is empty.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if kubeconfig == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	rc.QPS, rc.Burst = 20, 40
	return rc, nil
}

// Start starts the intake for agent a in the background, unless the
// configuration disables it. stop ends it and waits until it has stopped.
func Start(ctx context.Context, c Config, a Agent) (stop func(), err error) {
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if !c.Enabled() {
		log.Info("kubernetes intake off", "why", "no node name (--node-name or $NODE_NAME) or --kube-intake=off")
		return func() {}, nil
	}
	rc, err := RESTConfig(c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "resize-agent/" + c.NodeName
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	// client-go logs through klog; send it to the daemon's logger.
	klog.SetSlogLogger(log)
	in, err := New(client, a, Options{NodeName: c.NodeName, Predictor: c.Predictor, Logger: log})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, run := range c.Companions {
		wg.Go(func() {
			if err := run(ctx, client); err != nil {
				log.Error("kubernetes companion stopped", "err", err)
			}
		})
	}
	go func() {
		defer close(done)
		defer wg.Wait()
		if err := in.Run(ctx); err != nil {
			log.Error("kubernetes intake stopped", "err", err)
		}
	}()
	return func() { cancel(); <-done }, nil
}
