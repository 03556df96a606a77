#!/bin/sh
# sparkctl: the forced command of `image sync`'s node-to-node key on this node.
#
# The key's line in authorized_keys reads restrict,from="<source's fabric
# addresses>",expiry-time="...",command="<this file>": sshd runs this file
# whatever the client asked for, and puts what it asked for in
# SSH_ORIGINAL_COMMAND (sshd(8), AUTHORIZED_KEYS FILE FORMAT, command=).
#
# Allowed, exactly: "sparkctl-image-load REF" (REF a docker image reference):
# load the image streamed on stdin, then print REF's content digest, which the
# source compares with its own. Anything else is refused, and nothing is run.
set -u
prog="sparkctl image-sync key"
cmd=${SSH_ORIGINAL_COMMAND-}
case $cmd in
    "sparkctl-image-load "*) ref=${cmd#sparkctl-image-load } ;;
    "") echo "$prog: refused: an interactive login; this key only loads images (sparkctl image sync)" >&2
        exit 126 ;;
    *) echo "$prog: refused: this key only loads images (sparkctl image sync): $cmd" >&2
       exit 126 ;;
esac
# a docker reference: name[:tag][@digest], no blank, no shell character, no option
case $ref in
    "" | -* | *[!A-Za-z0-9._/:@-]*)
        echo "$prog: refused: not an image reference: $ref" >&2
        exit 126 ;;
esac
docker load >&2 || exit 1
# sparkctl replaces the next line with the content digest of "$ref" (sparkctl.model.imageid)
@CONTENT_DIGEST_OF_REF@
