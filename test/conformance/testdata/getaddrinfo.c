/*
 * getaddrinfo NAME: resolves NAME with the C library's getaddrinfo (AF_UNSPEC, SOCK_STREAM) and prints
 * each address on a line of its own, then "canonical NAME" when the library gives one. Exits 2 when the
 * lookup fails, with gai_strerror's text on stderr. The conformance tier builds it with musl-gcc -static,
 * so that it resolves as a musl (Alpine) Pod does: A and AAAA in parallel, over UDP only.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

int main(int argc, char **argv) {
	struct addrinfo hints, *res, *ai;
	char buf[INET6_ADDRSTRLEN];
	int rc;

	if (argc != 2) {
		fprintf(stderr, "usage: %s NAME\n", argv[0]);
		return 1;
	}
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_CANONNAME;
	rc = getaddrinfo(argv[1], NULL, &hints, &res);
	if (rc != 0) {
		fprintf(stderr, "%s: %s\n", argv[1], gai_strerror(rc));
		return 2;
	}
	for (ai = res; ai != NULL; ai = ai->ai_next) {
		const void *addr;
		if (ai->ai_family == AF_INET) {
			addr = &((struct sockaddr_in *)ai->ai_addr)->sin_addr;
		} else if (ai->ai_family == AF_INET6) {
			addr = &((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
		} else {
			continue;
		}
		if (inet_ntop(ai->ai_family, addr, buf, sizeof buf) != NULL) {
			printf("%s\n", buf);
		}
	}
	if (res != NULL && res->ai_canonname != NULL) {
		printf("canonical %s\n", res->ai_canonname);
	}
	freeaddrinfo(res);
	return 0;
}
