package api

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/resizer/resize-agent/agent/intent"
)

// Client talks to the API over a unix socket or TCP.
type Client struct {
	base  string
	http  *http.Client
	token string
}

// StatusError is an error response from the server.
type StatusError struct {
	Code int
	Body Error
}

func (e *StatusError) Error() string {
	if e.Body.Reason != "" {
		return fmt.Sprintf("%s (%d %s)", e.Body.Error, e.Code, e.Body.Reason)
	}
	return fmt.Sprintf("%s (%d)", e.Body.Error, e.Code)
}

// NewClient returns a client for address: a unix socket path, or an
// http:// URL.
func NewClient(address string) *Client {
	if strings.HasPrefix(address, "http://") || strings.HasPrefix(address, "https://") {
		return &Client{base: strings.TrimSuffix(address, "/"), http: &http.Client{}}
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", address)
	}}
	return &Client{base: "http://agent", http: &http.Client{Transport: tr}}
}

// WithTLS sets the TLS configuration (e.g. the CA that signed the agent's
// certificate) for an https:// address.
func (c *Client) WithTLS(conf *tls.Config) *Client {
	c.http = &http.Client{Transport: &http.Transport{TLSClientConfig: conf}}
	return c
}

// CloseIdleConnections closes the connections kept open for reuse.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// WithToken sets a bearer token sent with every request.
func (c *Client) WithToken(t string) *Client { c.token = t; return c }

func (c *Client) do(ctx context.Context, method, path string, body, out any) (int, error) {
	code, _, err := c.doHeader(ctx, method, path, body, out)
	return code, err
}

func (c *Client) doHeader(ctx context.Context, method, path string, body, out any) (int, http.Header, error) {
	return c.doWith(ctx, method, path, nil, body, out)
}

// doWith is a request with headers of the caller's.
func (c *Client) doWith(ctx context.Context, method, path string, hdr http.Header, body, out any) (int, http.Header, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		se := &StatusError{Code: resp.StatusCode}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &se.Body) != nil || se.Body.Error == "" {
			se.Body.Error = strings.TrimSpace(string(b))
		}
		return resp.StatusCode, resp.Header, se
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp.StatusCode, resp.Header, fmt.Errorf("decoding response: %w", err)
		}
	}
	return resp.StatusCode, resp.Header, nil
}

// Submit submits an intent. created is false when the server already had
// this intent (same id and spec).
//
// An intent without an ID gets one here, sent as its Idempotency-Key too,
// so that net/http may send it again when the server closed the kept-alive
// connection as the request went out (an agent at --max-connections closes
// the longest idle one): the server answers a repeat with the intent it
// accepted, never a second one. Without the key net/http retries only
// GETs.
func (c *Client) Submit(ctx context.Context, s intent.Spec) (it intent.Intent, created bool, err error) {
	if s.ID == "" {
		s.ID = intent.NewID()
	}
	code, _, err := c.doWith(ctx, http.MethodPost, "/v1/intents", http.Header{"Idempotency-Key": {s.ID}}, s, &it)
	return it, code == http.StatusAccepted, err
}

// MaxSubmitWait bounds how long a submission may wait for its intent to
// settle (POST /v1/intents?wait=); longer waits are a watch's job.
const MaxSubmitWait = 5 * time.Minute

// SubmitWait submits an intent as Submit does, and has the server answer
// once the intent has settled (terminal or Deferred) or wait has passed
// (at most MaxSubmitWait): one request where Submit and WaitSettled take two
// and a second connection. The intent comes back unsettled when wait
// passed first, or when the server's watch streams were at their cap and it
// answered at once; WaitSettled can then watch for the rest.
func (c *Client) SubmitWait(ctx context.Context, s intent.Spec, wait time.Duration) (it intent.Intent, created bool, err error) {
	if s.ID == "" {
		s.ID = intent.NewID()
	}
	wait = min(max(wait, time.Millisecond), MaxSubmitWait)
	path := "/v1/intents?wait=" + url.QueryEscape(wait.Round(time.Millisecond).String())
	code, _, err := c.doWith(ctx, http.MethodPost, path, http.Header{"Idempotency-Key": {s.ID}}, s, &it)
	return it, code == http.StatusAccepted, err
}

// Get returns one intent.
func (c *Client) Get(ctx context.Context, id string) (intent.Intent, error) {
	var it intent.Intent
	_, err := c.do(ctx, http.MethodGet, "/v1/intents/"+url.PathEscape(id), nil, &it)
	return it, err
}

// List returns intents, optionally for one container and in one state. It
// follows the server's pages to the end.
func (c *Client) List(ctx context.Context, container string, state intent.State) ([]intent.Intent, error) {
	var all []intent.Intent
	cont := ""
	for {
		page, next, err := c.ListPage(ctx, container, state, 0, cont)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if next == "" {
			if all == nil {
				all = []intent.Intent{}
			}
			return all, nil
		}
		cont = next
	}
}

// ListPage returns one page of intents: at most limit (0: the server's
// page size) after the page that answered cont ("" for the first). next is
// "" on the last page.
func (c *Client) ListPage(ctx context.Context, container string, state intent.State, limit int, cont string) (items []intent.Intent, next string, err error) {
	q := url.Values{}
	if container != "" {
		q.Set("container", container)
	}
	if state != "" {
		q.Set("state", string(state))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cont != "" {
		q.Set("continue", cont)
	}
	_, h, err := c.doHeader(ctx, http.MethodGet, "/v1/intents?"+q.Encode(), nil, &items)
	if err != nil {
		return nil, "", err
	}
	return items, h.Get(HeaderContinue), nil
}

// Containers lists managed containers.
func (c *Client) Containers(ctx context.Context) ([]ContainerInfo, error) {
	var out []ContainerInfo
	_, err := c.do(ctx, http.MethodGet, "/v1/containers", nil, &out)
	return out, err
}

// Forget stops the agent managing a container.
func (c *Client) Forget(ctx context.Context, name string) error {
	_, err := c.do(ctx, http.MethodDelete, "/v1/containers/"+url.PathEscape(name), nil, nil)
	return err
}

// Node returns the node's capacity account.
func (c *Client) Node(ctx context.Context) (NodeInfo, error) {
	var out NodeInfo
	_, err := c.do(ctx, http.MethodGet, "/v1/node", nil, &out)
	return out, err
}

// Watch calls fn for every event until fn returns false, the stream ends
// or ctx is done.
func (c *Client) Watch(ctx context.Context, f Filter, fn func(Event) bool) error {
	q := url.Values{}
	if f.IntentID != "" {
		q.Set("intent", f.IntentID)
	}
	if f.Container != "" {
		q.Set("container", f.Container)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/watch?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		se := &StatusError{Code: resp.StatusCode}
		_ = json.Unmarshal(b, &se.Body)
		return se
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			if ctx.Err() != nil {
				return ctx.Err() // the cancellation cut the last line short
			}
			return fmt.Errorf("decoding event: %w", err)
		}
		if !fn(e) {
			return nil
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
		return err
	}
	return ctx.Err()
}

// WaitSettled waits until the intent is terminal or Deferred and returns
// it. A watch stream that ends early (the server cut a slow watcher off) is
// opened again.
func (c *Client) WaitSettled(ctx context.Context, id string) (intent.Intent, error) {
	settled := func(it intent.Intent) bool { return it.Status.State.Settled() }
	for {
		var last intent.Intent
		err := c.Watch(ctx, Filter{IntentID: id}, func(e Event) bool {
			last = e.Intent
			return !settled(last)
		})
		if settled(last) {
			return last, nil
		}
		if ctx.Err() != nil {
			return last, fmt.Errorf("intent %s not settled: %w", id, ctx.Err())
		}
		var se *StatusError
		if errors.As(err, &se) {
			return last, err
		}
		it, gerr := c.Get(ctx, id)
		if gerr != nil {
			return last, errors.Join(err, gerr)
		}
		if settled(it) {
			return it, nil
		}
	}
}
