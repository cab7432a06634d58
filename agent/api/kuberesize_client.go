package api

import (
	"context"
	"net/http"
	"net/url"
)

// KubeResizes lists the Kubernetes resizes the agent measured on its node,
// those of one pod (namespace/name) if pod is set.
func (c *Client) KubeResizes(ctx context.Context, pod string) ([]KubeResize, error) {
	p := "/v1/kube/resizes"
	if pod != "" {
		p += "?pod=" + url.QueryEscape(pod)
	}
	var out []KubeResize
	_, err := c.do(ctx, http.MethodGet, p, nil, &out)
	return out, err
}
