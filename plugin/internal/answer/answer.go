// Package answer classifies DNS responses the way CoreDNS's cache plugin does, so that the plugins in front of
// it (clamp, wirecache) apply the same window and lifetime to a response as the cache does.
package answer

import (
	"strings"

	"github.com/miekg/dns"
)

// Class says which of the cache's windows a response belongs to.
type Class int

const (
	// Other is a response no window applies to: an rcode other than NOERROR and NXDOMAIN.
	Other Class = iota
	// Success is an answer with data, a referral, or NOERROR with data outside the answer section (whoami).
	Success
	// Denial is NXDOMAIN, or NODATA: NOERROR with an SOA in the authority section and no answer to the
	// question, with or without the CNAME chain that led there (RFC 2308 section 2.2).
	Denial
)

// Classify returns the class of m. It follows CoreDNS v1.15's cache (response.Typify, with a NOERROR whose
// answer does not answer the question and that carries an SOA reclassified as NODATA), except where Typify
// gives up on a response that still has a window: an NXDOMAIN that carries a CNAME chain is a denial, and an
// answer with an expired signature keeps its class. Whether such a response may be stored is the storing
// plugin's decision, not this one.
func Classify(m *dns.Msg) Class {
	switch m.Rcode {
	case dns.RcodeNameError:
		return Denial
	case dns.RcodeSuccess:
	default:
		return Other
	}
	if HasSOA(m) && !AnswersQuestion(m) {
		return Denial
	}
	return Success
}

// HasSOA reports whether the authority section of m holds an SOA record.
func HasSOA(m *dns.Msg) bool {
	for _, rr := range m.Ns {
		if rr.Header().Rrtype == dns.TypeSOA {
			return true
		}
	}
	return false
}

// AnswersQuestion reports whether the answer section of m answers its question: for ANY a record at the
// question name, for CNAME a CNAME there, and for any other type a record of that type at the end of the
// CNAME chain that starts at the question name (RFC 1034 section 3.6.2). A chain with a loop, or a name with
// two different CNAME targets (RFC 2181 section 10.1), answers nothing.
func AnswersQuestion(m *dns.Msg) bool {
	if len(m.Question) == 0 || len(m.Answer) == 0 {
		return false
	}
	q := m.Question[0]
	switch q.Qtype {
	case dns.TypeANY:
		for _, rr := range m.Answer {
			if h := rr.Header(); classMatches(h.Class, q.Qclass) && strings.EqualFold(h.Name, q.Name) {
				return true
			}
		}
		return false
	case dns.TypeCNAME:
		target, ok := cnameTarget(m.Answer, q.Name, q.Qclass)
		return ok && target != ""
	}
	name, ok := chainEnd(m.Answer, q.Name, q.Qclass)
	if !ok {
		return false
	}
	for _, rr := range m.Answer {
		if h := rr.Header(); h.Rrtype == q.Qtype && classMatches(h.Class, q.Qclass) && strings.EqualFold(h.Name, name) {
			return true
		}
	}
	return false
}

// chainEnd follows the CNAME chain in answer from name and returns the name it ends at; ok is false for a
// loop or an ambiguous link.
func chainEnd(answer []dns.RR, name string, qclass uint16) (string, bool) {
	// Each step follows one CNAME, so a chain longer than the answer section has a loop.
	for range len(answer) + 1 {
		target, ok := cnameTarget(answer, name, qclass)
		if !ok {
			return "", false
		}
		if target == "" {
			return name, true
		}
		name = target
	}
	return "", false
}

// cnameTarget returns the target of the CNAME at owner, "" when owner has none; ok is false when owner has
// CNAMEs to different targets.
func cnameTarget(answer []dns.RR, owner string, qclass uint16) (target string, ok bool) {
	for _, rr := range answer {
		c, isCNAME := rr.(*dns.CNAME)
		if !isCNAME || !classMatches(c.Hdr.Class, qclass) || !strings.EqualFold(c.Hdr.Name, owner) {
			continue
		}
		switch {
		case target == "":
			target = c.Target
		case !strings.EqualFold(target, c.Target):
			return "", false
		}
	}
	return target, true
}

func classMatches(class, qclass uint16) bool { return qclass == dns.ClassANY || class == qclass }
