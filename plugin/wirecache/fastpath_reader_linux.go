//go:build linux

package wirecache

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"time"
	"unsafe"

	"github.com/nodelocaldns/nodelocaldns/plugin/internal/rawread"

	"golang.org/x/sys/unix"
)

// The fast path's readers: batches of datagrams in (recvmmsg), hits answered, replies out (sendmmsg).

// fastReader is one goroutine's buffers: the datagrams of a batch, their senders, and the replies.
type fastReader struct {
	fp *fastPath

	hdrs  [fastBatch]unix.Mmsghdr
	iovs  [fastBatch]unix.Iovec
	names [fastBatch]unix.RawSockaddrInet6
	in    [fastBatch][fastReadSize]byte

	out     [fastBatch]unix.Mmsghdr
	outIovs [fastBatch]unix.Iovec
	nOut    int
	arena   []byte

	wq  wireQuery
	key [keyLen]byte

	// The state of the current recvmmsg and sendmmsg calls, and the calls bound once, so that a batch
	// allocates nothing.
	sendNow              bool
	recvN, sendN, sent   int
	recvErrno, sendErrno syscall.Errno
	serveFn              func(fd uintptr) (rawread.Result, syscall.Errno)
	sendFn               func(fd uintptr) bool
	recvOnce, sendOnce   func(fd uintptr)
}

func newFastReader(fp *fastPath) *fastReader {
	r := &fastReader{fp: fp, arena: make([]byte, 0, fastArena)}
	r.serveFn, r.sendFn = r.serve, r.send
	r.recvOnce = func(fd uintptr) { r.recvN, r.recvErrno = r.recv(fd) }
	r.sendOnce = func(fd uintptr) { r.send(fd) }
	for i := range r.hdrs {
		r.iovs[i].Base = &r.in[i][0]
		r.iovs[i].SetLen(fastReadSize)
		r.hdrs[i].Hdr.Iov = &r.iovs[i]
		r.hdrs[i].Hdr.SetIovlen(1)
		r.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&r.names[i]))
	}
	return r
}

// run is the reader that waits for datagrams: it reads what the socket holds, a batch at a time, answers it
// and waits again (serve), and wakes a helper when a batch comes full.
func (r *fastReader) run() {
	for {
		err := rawread.Serve(r.fp.raw, r.serveFn)
		if errno := syscall.Errno(0); errors.As(err, &errno) {
			err = os.NewSyscallError("recvmmsg", errno)
		}
		if err == nil {
			continue // serve saw the fast path stopping: the next Serve returns the deadline stop set
		}
		if !r.fp.stopping.Load() {
			// Closing the socket takes it out of the group, so no query waits where nobody reads.
			log.Errorf("fast path on %s: reading: %v; closing it, the plugin chain's socket answers instead", r.fp.srv.Addr, err)
			r.fp.conn.Close()
			return
		}
		// Stopping: whatever is queued is answered without waiting for more.
		r.readQueued()
		return
	}
}

// serve reads a batch and answers it, as rawread.Serve calls it. A batch shorter than asked for means that
// recvmmsg found the socket empty, so it waits then without the read that would find it empty again: a
// query that wakes the cache costs four system calls instead of five.
func (r *fastReader) serve(fd uintptr) (rawread.Result, syscall.Errno) {
	n, e := r.recv(fd)
	if e != 0 {
		return rawread.Done, e
	}
	r.handle(n)
	switch {
	case r.fp.stopping.Load():
		return rawread.Done, 0
	case n < fastBatch:
		return rawread.Empty, 0
	}
	return rawread.More, 0
}

// help is a reader that helps run's: woken when a batch came full (more may be queued), it reads what the
// socket holds without waiting, and goes back to wait once the socket is empty or a batch comes short. A
// second reader waiting on the socket itself would be woken with the first by every datagram (the socket's
// read lock hands over to it), which more than doubled the cache's CPU per query at a few thousand queries
// a second with two CPUs; a helper costs nothing until the queries come faster than one reader answers.
func (r *fastReader) help() {
	for {
		select {
		case <-r.fp.helpWanted:
			r.readQueued()
		case <-r.fp.readersStop:
			return
		}
	}
}

// readQueued reads and answers what the socket holds, without waiting for more, until it is empty or a batch
// comes short.
func (r *fastReader) readQueued() {
	for {
		n, err := r.readNow()
		if err != nil || n == 0 {
			return
		}
		r.handle(n)
		if n < fastBatch {
			return
		}
	}
}

// readNow fills the batch with what the socket holds, without waiting. Control makes the call even once a
// read deadline has passed (stop sets one).
func (r *fastReader) readNow() (int, error) {
	r.recvN, r.recvErrno = 0, 0
	if err := r.fp.raw.Control(r.recvOnce); err != nil {
		return 0, err
	}
	switch {
	case r.recvErrno == unix.EAGAIN, r.recvErrno == unix.EINTR:
		return 0, nil
	case r.recvErrno != 0:
		return 0, os.NewSyscallError("recvmmsg", r.recvErrno)
	}
	return r.recvN, nil
}

// recv fills the batch with what the socket holds, in one recvmmsg call that never waits (MSG_DONTWAIT).
//
// recv and send make their calls raw: a call through unix.Syscall6 tells the Go scheduler it entered the
// kernel, which wakes the runtime's monitor thread (sysmon) whenever the process was idle. A cache answering
// a few thousand queries a second is idle between most of them, and each such wake-up costs it two context
// switches and the monitor's 20 µs ticks while it works.
func (r *fastReader) recv(fd uintptr) (int, syscall.Errno) {
	for i := range r.hdrs {
		r.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		r.hdrs[i].Hdr.Flags = 0
		r.hdrs[i].Len = 0
	}
	n, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])), fastBatch, unix.MSG_DONTWAIT, 0, 0)
	return int(n), e
}

// handle answers the hits of a batch of n datagrams, passes the rest on, and sends the replies.
func (r *fastReader) handle(n int) {
	fp := r.fp
	fp.queries.Add(float64(n))
	now := time.Now()
	for i := range n {
		h := &r.hdrs[i]
		b := r.in[i][:h.Len]
		if p := fp.probe.Load(); p != nil && bytes.Equal(b, *p) {
			select {
			case fp.probeSeen <- struct{}{}:
			default:
			}
			continue
		}
		plain := false
		if h.Hdr.Flags&unix.MSG_TRUNC == 0 {
			var answered bool
			if answered, plain = r.answer(b, i, now); answered {
				continue
			}
		}
		// Counted before it is handed over: the server may answer it before this batch is done, and
		// whoever got that answer may read the counter next.
		fp.passed.Inc()
		from := sockaddrUDP(&r.names[i], h.Hdr.Namelen)
		if from == nil {
			continue
		}
		q := passedQuery{b: bytes.Clone(b), from: from}
		if fp.servers != nil && (plain || serverAccepts(b)) {
			fp.servers.serve(q)
		} else {
			fp.chain.passQuery(q)
		}
	}
	if n == fastBatch && fp.helpBeside {
		// More may be queued: an idle helper reads it meanwhile. With one P it could only read once this
		// reader waits, which finds the socket empty.
		select {
		case fp.helpWanted <- struct{}{}:
		default:
		}
	}
	r.flush()
}

// answer writes the reply to datagram i from its block's store, if it holds one, and reports whether it did,
// and whether parseWireQuery read it (a plain query).
func (r *fastReader) answer(b []byte, i int, now time.Time) (answered, plain bool) {
	n, ok := parseWireQuery(b, &r.wq, &r.key)
	if !ok {
		if !r.wq.badVersion {
			return false, false
		}
		r.queueReply(i, badVersionReply(r.room(badVersionReplyLen)[:0], b, &r.wq))
		return true, false
	}
	block := r.fp.routes.route(unsafe.String(&r.key[0], n-5))
	if block == nil {
		return false, true
	}
	wc := block.wc
	e := wc.store.get(wc.store.hash(r.key[:n]), r.key[:n])
	if e == nil {
		return false, true
	}
	buf := r.room(len(e.wire(e.plain)) + optLen)
	q := &r.wq.q
	out, ok := e.render(buf, q, client{v6: r.fp.v6}, now)
	if !ok {
		// Expired (the chain refreshes it, or serves it stale), or a reply that needs truncation.
		return false, true
	}
	m := block.metrics
	m.hits.Inc()
	if m.core != nil {
		m.core.count(&hit{
			zone: int(e.metricsZone), v6: r.fp.v6, do: q.do(), qtype: q.qtype, rcode: int(e.rcode),
			reqSize: len(b), respSize: int(e.chainLen), start: now,
		})
	}
	r.queueReply(i, out)
	return true, true
}

// room returns the free part of the batch's arena, at least need bytes, sending the replies so far first if
// they leave less.
func (r *fastReader) room(need int) []byte {
	if cap(r.arena)-len(r.arena) < need {
		r.flush()
	}
	return r.arena[len(r.arena):cap(r.arena)]
}

// queueReply adds out, written at the start of room's bytes, to the batch's replies, to datagram i's sender.
func (r *fastReader) queueReply(i int, out []byte) {
	r.arena = r.arena[:len(r.arena)+len(out)]
	o := &r.out[r.nOut]
	r.outIovs[r.nOut].Base = &out[0]
	r.outIovs[r.nOut].SetLen(len(out))
	o.Hdr = unix.Msghdr{Name: r.hdrs[i].Hdr.Name, Namelen: r.hdrs[i].Hdr.Namelen, Iov: &r.outIovs[r.nOut]}
	o.Hdr.SetIovlen(1)
	r.nOut++
}

// flush sends the replies of the batch.
func (r *fastReader) flush() {
	stopping := r.fp.stopping.Load()
	for r.sent = 0; r.sent < r.nOut; {
		r.sendErrno, r.sendN, r.sendNow = 0, 0, stopping
		var err error
		if stopping {
			err = r.fp.raw.Control(r.sendOnce)
		} else {
			err = r.fp.raw.Write(r.sendFn)
		}
		if err == nil && r.sendErrno == unix.EINTR {
			continue
		}
		if err != nil || r.sendErrno != 0 {
			// The first reply left failed (a firewall, an unreachable client): it is dropped, as a
			// failed write of CoreDNS's listener drops it, and the rest go on.
			r.writeFailed(errors.Join(err, errnoErr(r.sendErrno)))
			r.sendN = 1
		}
		r.sent += r.sendN
	}
	r.nOut = 0
	r.arena = r.arena[:0]
}

// send is the sendmmsg call of flush, as syscall.RawConn.Write takes it: false asks to wait for the socket.
func (r *fastReader) send(fd uintptr) bool {
	n, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&r.out[r.sent])), uintptr(r.nOut-r.sent), unix.MSG_DONTWAIT, 0, 0)
	if e == unix.EAGAIN && !r.sendNow {
		return false
	}
	r.sendN, r.sendErrno = int(n), e
	return true
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return os.NewSyscallError("sendmmsg", e)
}

func (r *fastReader) writeFailed(err error) {
	now := time.Now().UnixNano()
	last := r.fp.lastWriteError.Load()
	if now-last < int64(writeErrorEvery) || !r.fp.lastWriteError.CompareAndSwap(last, now) {
		return
	}
	log.Errorf("fast path on %s: a reply was not sent: %v", r.fp.srv.Addr, err)
}
