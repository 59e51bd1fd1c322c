"""GStreamer's RTSP server (gst-rtsp-server through python3-gi) serving one file over UDP: an
MPEG-TS file as MP2T/RTP (payload type 33), or an H.264 + AAC MP4 as two RTP sessions
(H.264, RFC 6184; AAC, RFC 3640 AAC-hbr). The peer of `penstock bench rtsp`, which writes
this script to a temporary file and runs it.

Usage: rtsp_gst.py FILE MOUNT [ts|mp4]
Prints "port N" on stdout once it serves rtsp://127.0.0.1:N/MOUNT; runs until killed.
"""
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtsp", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtsp, GstRtspServer  # noqa: E402

Gst.init(None)
path, mount = sys.argv[1], sys.argv[2]
media = sys.argv[3] if len(sys.argv) > 3 else "ts"
if '"' in path:
    sys.exit("the file's path must not hold a double quote (the launch line quotes it)")
server = GstRtspServer.RTSPServer()
server.set_address("127.0.0.1")
server.set_service("0")  # a free port, printed below
factory = GstRtspServer.RTSPMediaFactory()
# tsparse set-timestamps=true stamps the buffers from the PCR, so the media pipeline's sinks
# (synced to its clock) send at the file's own rate: measured at 20.4 s for a 20 s clip.
# Without it the file goes out as fast as it is read. Not shared: each session reads its
# own file through its own pipeline, as each penstock session is its own engine stream.
if media == "ts":
    launch = (
        '( filesrc location="%s" ! tsparse set-timestamps=true ! rtpmp2tpay name=pay0 pt=33 )'
        % path
    )
elif media == "mp4":
    # qtdemux's samples carry their times, so the sinks send at the file's own rate.
    launch = (
        '( filesrc location="%s" ! qtdemux name=d '
        "d.video_0 ! queue ! h264parse ! rtph264pay name=pay0 pt=96 config-interval=-1 "
        "d.audio_0 ! queue ! aacparse ! rtpmp4gpay name=pay1 pt=97 )" % path
    )
else:
    sys.exit("media: ts or mp4, not %r" % media)
factory.set_launch(launch)
factory.set_shared(False)
factory.set_protocols(GstRtsp.RTSPLowerTrans.UDP)
server.get_mount_points().add_factory(mount, factory)
if server.attach(None) == 0:
    sys.exit("gst-rtsp-server: attach failed")
print("port %d" % server.get_bound_port(), flush=True)
GLib.MainLoop().run()
