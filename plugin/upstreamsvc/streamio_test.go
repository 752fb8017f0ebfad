package upstreamsvc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// frames returns msgs as a TCP stream carries them, each after its length.
func frames(msgs ...[]byte) []byte {
	var out []byte
	for _, m := range msgs {
		out = binary.BigEndian.AppendUint16(out, uint16(len(m)))
		out = append(out, m...)
	}
	return out
}

// testMessages returns n messages of sizes from 1 byte to the largest, each byte telling which it is.
func testMessages(n int) [][]byte {
	sizes := []int{12, 1, 300, 65535, 2, 512, 4096}
	msgs := make([][]byte, n)
	for i := range msgs {
		msgs[i] = bytes.Repeat([]byte{byte(i)}, sizes[i%len(sizes)])
	}
	return msgs
}

// TestFrameReaderSplitsMessages feeds a stream to a frameReader in reads of every size from one byte to the
// whole stream, and checks that it hands on each message whole, once, in order.
func TestFrameReaderSplitsMessages(t *testing.T) {
	msgs := testMessages(9)
	stream := frames(msgs...)
	for _, chunk := range []int{1, 2, 3, 7, 1000, 65537, len(stream)} {
		t.Run(fmt.Sprint(chunk), func(t *testing.T) {
			f := newFrameReader()
			var got [][]byte
			for rest := stream; len(rest) > 0; {
				room := f.room()
				if len(room) == 0 {
					t.Fatal("no room to read into")
				}
				n := copy(room, rest[:min(chunk, len(rest))])
				rest = rest[n:]
				f.add(n, func(m []byte) { got = append(got, bytes.Clone(m)) })
			}
			if len(got) != len(msgs) {
				t.Fatalf("%d messages handed on, want %d", len(got), len(msgs))
			}
			for i := range msgs {
				if !bytes.Equal(got[i], msgs[i]) {
					t.Fatalf("message %d: %d bytes starting %v, want %d starting %v", i, len(got[i]), got[i][:1], len(msgs[i]), msgs[i][:1])
				}
			}
		})
	}
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// readAll starts sio.readMessages, and returns the messages it hands on and what it returns.
func readAll(sio streamIO) (<-chan []byte, <-chan error) {
	msgs, done := make(chan []byte, 256), make(chan error, 1)
	go func() { done <- sio.readMessages(func(m []byte) { msgs <- bytes.Clone(m) }) }()
	return msgs, done
}

// TestReadMessages checks each way of reading a connection (net.Conn's, and the raw calls where there are
// some) against an upstream that writes bursts of answers cut anywhere, then one more answer and its end
// of the stream at once: every answer is handed on with no later segment to wake the reader, and the end
// ends the reading. Reading raw waits without the read that finds the socket empty, which must not take an
// answer and the end coming together for an empty socket.
func TestReadMessages(t *testing.T) {
	for name, newIO := range map[string]func(net.Conn) (streamIO, error){
		"conn":   func(c net.Conn) (streamIO, error) { return connIO{c}, nil },
		"stream": newStreamIO,
	} {
		t.Run(name, func(t *testing.T) {
			client, server := tcpPair(t)
			sio, err := newIO(client)
			if err != nil {
				t.Fatal(err)
			}
			got, done := readAll(sio)
			for burst := range 60 {
				msgs := testMessages(1 + burst%5)
				stream := frames(msgs...)
				for cut := 1 + burst%13; len(stream) > 0; {
					n := min(cut, len(stream))
					if _, err := server.Write(stream[:n]); err != nil {
						t.Fatal(err)
					}
					stream, cut = stream[n:], cut*7
				}
				for i, want := range msgs {
					select {
					case m := <-got:
						if !bytes.Equal(m, want) {
							t.Fatalf("burst %d, answer %d: %d bytes, want %d", burst, i, len(m), len(want))
						}
					case err := <-done:
						t.Fatalf("burst %d: reading ended: %v", burst, err)
					case <-time.After(waitLimit): // bounds a failure only
						t.Fatalf("burst %d: answer %d of %d not handed on", burst, i+1, len(msgs))
					}
				}
			}

			for i := range 100 {
				client, server := tcpPair(t)
				sio, err := newIO(client)
				if err != nil {
					t.Fatal(err)
				}
				got, done := readAll(sio)
				if _, err := server.Write(frames([]byte("last answer"))); err != nil {
					t.Fatal(err)
				}
				server.Close()
				select {
				case err := <-done:
					if !errors.Is(err, io.EOF) {
						t.Fatalf("connection %d: reading ended with %v, want EOF", i, err)
					}
				case <-time.After(waitLimit): // bounds a failure only
					t.Fatalf("connection %d: the upstream's end of the stream did not end the reading", i)
				}
				if m := <-got; string(m) != "last answer" {
					t.Fatalf("connection %d: %q handed on", i, m)
				}
			}
		})
	}
}
