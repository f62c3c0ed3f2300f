// A hashicorp/memberlist member set up as Gubernator's member-list pool sets up its own
// (DefaultWANConfig, the node's PeerInfo as JSON metadata), for the interop test in
// test_memberlist_interop.py: it joins the given nodes, prints the members it sees as one
// JSON line every 200 ms, and leaves after the given number of seconds or when its stdin
// closes.
//
//	memberlist_node NAME PORT GRPC_ADDRESS SECONDS [KNOWN_NODE...]
//
// Built against Debian's golang-github-hashicorp-memberlist-dev (GOPATH mode).
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	ml "github.com/hashicorp/memberlist"
)

// peerInfo is Gubernator's PeerInfo as its member-list pool marshals it.
type peerInfo struct {
	DataCenter  string `json:"data-center"`
	HTTPAddress string `json:"http-address"`
	GRPCAddress string `json:"grpc-address"`
}

type delegate struct{ meta []byte }

func (d *delegate) NodeMeta(limit int) []byte                  { return d.meta }
func (d *delegate) NotifyMsg([]byte)                           {}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

type member struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
	Port uint16 `json:"port"`
	Meta string `json:"meta"`
}

func main() {
	if len(os.Args) < 5 {
		fmt.Fprintln(os.Stderr, "usage: memberlist_node NAME PORT GRPC_ADDRESS SECONDS [KNOWN...]")
		os.Exit(2)
	}
	port, _ := strconv.Atoi(os.Args[2])
	seconds, _ := strconv.Atoi(os.Args[4])
	known := os.Args[5:]
	meta, _ := json.Marshal(&peerInfo{GRPCAddress: os.Args[3]})

	conf := ml.DefaultWANConfig()
	conf.Name = os.Args[1]
	conf.BindAddr, conf.BindPort = "127.0.0.1", port
	conf.AdvertiseAddr, conf.AdvertisePort = "127.0.0.1", port
	conf.Delegate = &delegate{meta}
	conf.LogOutput = os.Stderr
	list, err := ml.Create(conf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "create:", err)
		os.Exit(1)
	}
	if len(known) > 0 {
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err = list.Join(known); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(300 * time.Millisecond)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "join:", err)
			os.Exit(1)
		}
	}
	closed := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(closed) }()
	end := time.After(time.Duration(seconds) * time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	for running := true; running; {
		select {
		case <-tick.C:
			var seen []member
			for _, n := range list.Members() {
				seen = append(seen, member{n.Name, n.Addr.String(), n.Port, string(n.Meta)})
			}
			line, _ := json.Marshal(seen)
			fmt.Println(string(line))
		case <-end:
			running = false
		case <-closed:
			running = false
		}
	}
	_ = list.Leave(2 * time.Second)
	_ = list.Shutdown()
}
