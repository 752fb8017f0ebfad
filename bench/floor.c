/*
 * floor: the least a DNS server answering over a socket can cost, for bench/floor.sh. One thread, one
 * blocking socket, one recvfrom and one sendto per query: an A query is answered with one A record (10.97.0.1,
 * TTL 30), any other query with an empty NOERROR answer. No cache, no upstream, no parsing beyond the
 * question's end: what is left is the kernel's part of a query (waking the server, the receive, the send and
 * waking the client) that every server pays.
 *
 *   floor ADDRESS     (IPv4, port 53)
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

/* answer turns the query m of n bytes into its answer in place and returns the answer's length, 0 for none. */
static size_t answer(unsigned char *m, size_t n) {
    size_t i = 12;
    if (n < 17 || (m[2] & 0x80) || m[4] != 0 || m[5] != 1) return 0; /* a query with one question */
    while (i < n && m[i] != 0) i += m[i] + 1;                          /* the question's name */
    if (i + 5 > n) return 0;
    i += 5; /* the root label, the type and the class */
    int isA = m[i - 4] == 0 && m[i - 3] == 1;
    m[2] = (m[2] & 0x79) | 0x80; /* QR; the opcode and RD kept */
    m[3] = 0x80;                 /* RA, NOERROR */
    m[6] = 0, m[7] = isA;        /* ANCOUNT; NSCOUNT and ARCOUNT 0 (an OPT is dropped) */
    m[8] = m[9] = m[10] = m[11] = 0;
    if (!isA) return i;
    static const unsigned char rr[] = {0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 10, 97, 0, 1};
    memcpy(m + i, rr, sizeof rr);
    return i + sizeof rr;
}

int main(int argc, char **argv) {
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(53)};
    if (argc != 2 || inet_pton(AF_INET, argv[1], &sin.sin_addr) != 1) {
        fprintf(stderr, "usage: floor IPV4-ADDRESS\n");
        return 2;
    }
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sin, sizeof sin) < 0) {
        perror("floor: bind");
        return 1;
    }
    unsigned char buf[4096 + 16]; /* room for the record after the longest query read */
    for (;;) {
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        ssize_t r = recvfrom(fd, buf, 4096, 0, (struct sockaddr *)&from, &fl);
        if (r <= 0) continue;
        size_t out = answer(buf, (size_t)r);
        if (out) sendto(fd, buf, out, 0, (struct sockaddr *)&from, fl);
    }
}
