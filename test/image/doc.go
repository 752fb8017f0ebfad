// Package image tests the node-cache image build/image.sh (`make image`) makes: that it is the image the
// manifests name, that a second build gives the same digest, and that, unpacked by umoci and run by runc, a
// real OCI runtime, with the DaemonSet's settings on a simulated node (package simnode), its cache container
// installs its rules and answers Pods as the binary does, and its guard container fails the node open when
// the cache container is killed. They need root, runc, umoci, apt-get and dpkg-deb (and what simnode and the
// e2e tier need); under `make test` a missing one is a failure.
//
//	NODELOCALDNS_REQUIRE_PRIVILEGED=1 go test -v -count=1 ./test/image/
package image
