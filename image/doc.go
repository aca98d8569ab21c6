// Package image keeps the root filesystem images of corral's machines: a
// store of unpacked, content-addressed layers under a state directory
// (<state>/images), the images imported into it from OCI image layouts and
// image tarballs, and the embedded default image "base".
//
// # Layout
//
// A store is a directory, owned by root and mode 0700 (Open refuses one
// owned by another user and tightens a wider mode), holding:
//
//	layers/sha256-<hex>/   one unpacked layer, named by its diffID (the
//	                       sha256 of its uncompressed tar), shared by every
//	                       image that has it; unpacked once
//	layers/base-<n>/       the generated root of the image "base"
//	images/<name>.json     an image record: its config digest, layers
//	                       (lowest first), config, creation time, size
//	tmp/                   layers being unpacked; renamed into layers/ when
//	                       complete, so a layer directory is always whole
//	lock                   flock(2): imports and the making of base
//	                       share it, Remove (which collects unreferenced
//	                       layers) holds it alone
//	base.lock              flock(2): one maker of base at a time
//
// A layer is unpacked into tmp/ and renamed into place: two imports of the
// same layer at once both unpack it, the first rename wins and the other
// copy is discarded. A layer's uncompressed content is hashed while it is
// unpacked and must match its diffID, or the import fails.
//
// # Ownership
//
// The store claims a block of 65536 host ids with internal/idrange
// ([Store.IDs]). A file owned by u:g in an image is stored owned by
// IDs().Start+u : IDs().Start+g, so no unpacked file belongs to host root
// or to any host user; an image whose tar carries an id ≥ 65536 is refused
// with ErrUnsafe. The machine's root mounts the layers idmapped from this
// block onto the machine's own range. Set-id mode bits are kept: a set-id
// file elevates only to an id of the store's block, which is unprivileged
// on the host, and no host user can reach the files (the store root is
// 0700).
//
// # Tar hazards
//
// Layers are unpacked entry by entry without ever following a symlink:
// every parent directory is resolved beneath the layer's root with
// openat2(2) RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, and every leaf is made
// with an *at call that does not follow it. The rules, each refusing the
// whole import with an error wrapping ErrUnsafe that names the entry:
//
//   - an entry whose name is absolute or has a ".." component;
//   - an entry whose parent path passes through a symlink (one made by an
//     earlier entry of the layer: "link -> /etc" then "link/passwd");
//   - a hard link whose target name is absolute, has a ".." component,
//     passes through a symlink, or names nothing unpacked before it;
//   - a file owner or group ≥ 65536;
//   - a file that would bring the import past Options.MaxSize bytes of
//     content (a sparse entry of a few bytes can claim a terabyte).
//
// Each layer is unpacked on its own (it is shared by every image that has
// it, whatever lies below it), so a name is resolved within its own layer
// only: a missing parent directory is made as a directory of the layer
// (0755, image root). A layer that writes "bin/x" above a lower layer's
// symlink "bin -> usr/bin" therefore shadows the symlink with a directory
// in the machine's root, where a runtime that unpacks onto the merged tree
// would have written usr/bin/x. Layers built by docker or buildah record
// the resolved path and do not do this.
//
// A symlink entry itself is kept with its target verbatim, absolute or
// relative (/etc/alternatives/* and the like are absolute in every root
// filesystem): it is only ever resolved inside a machine, against the
// machine's root.
//
// Otherwise:
//
//   - character and block devices and fifos are skipped (the machine's
//     /dev is its own), except a character device 0/0, which is an overlay
//     whiteout and kept as one;
//   - extended attributes are dropped except user.*, and of those
//     user.overlay.* is dropped too (it would steer the machine's overlay);
//     security.capability in particular never reaches the store;
//   - runs of zeros are written as holes (a sparse file stays sparse);
//   - hard links within the layer are kept, mode bits (set-id included)
//     and modification times are kept, owners are shifted as above.
//
// # Whiteouts
//
// A layer is stored in the form overlayfs reads when it is mounted with the
// userxattr option, inside the machine's user namespace: ".wh.NAME"
// becomes a character device 0/0 named NAME (hiding NAME of the lower
// layers), and an opaque directory marker ".wh..wh..opq" becomes the
// xattr user.overlay.opaque=y on its directory. The machine's root must be
// mounted with userxattr.
//
// # The image "base"
//
// Get("base") makes the default image on first use, from the host alone:
// one generated layer with the host's merged-usr links (/bin, /lib*,
// /sbin: the host's top-level symlinks that point into usr), empty mount
// points, and a generated /etc (see base.go), with HostBinds ["/usr"]: the
// machine binds the host's /usr read-only on top. Nothing else of the host
// is in it: no shadow, no /root, /home, /var, /srv, /opt, /run or /mnt
// contents, no socket, no state directory. Its /etc/os-release is the
// host's (Debian's is a link into /usr/lib); its /etc/gitconfig only marks
// /workspace (and what is below it) safe.directory, so that git works in a
// root-owned checkout, which the machine binds without idmapping. Its
// config: user "user", working directory /workspace, no Env (the machine
// sets PATH). Its record carries a version stamp; a record from an older
// generator is remade, and Remove("base") makes the next Get remake it.
package image
