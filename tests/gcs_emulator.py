"""A Google Cloud Storage emulator on 127.0.0.1 for the gs:// tests, and the environment that points
every client of a run at it.

    python -m tests.gcs_emulator PORT BUCKET     # serves in memory until killed

It is gcp-storage-emulator with one addition: its object downloads carry no `x-goog-generation`
header, and tensorstore's GCS driver (orbax writes checkpoint arrays through it) takes an object's
generation from that header, so every checkpoint read fails with "Malformed StorageGeneration"
without it. Real GCS sends it; here the download handler adds it from the object's metadata.
"""

from __future__ import annotations

import sys


def client_env(port: int) -> dict[str, str]:
    """The variables that point the run's storage clients at the emulator on `port`."""
    url = f"http://127.0.0.1:{port}"
    return {
        "STORAGE_EMULATOR_HOST": url,  # gcsfs (epath's gs:// backend) and google-cloud-storage (tensorboardX)
        "TENSORSTORE_GCS_HTTP_URL": url,  # tensorstore (orbax's arrays)
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",  # tensorstore asks for credentials; the emulator ignores them
        "GOOGLE_CLOUD_PROJECT": "emulator",  # google-cloud-storage's client wants a project
        # gcsfs 2026 first asks the storage-control gRPC API whether a bucket is zonal; the emulator
        # has no gRPC endpoint, so that probe would wait 60 s per call before falling back.
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    }


def _with_generation_headers() -> None:
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    download = objects.download

    def download_with_generation(request, response, storage, *args, **kwargs):
        download(request, response, storage, *args, **kwargs)
        if response.status.value < 300:
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
            response["x-goog-generation"] = str(obj["generation"])
            response["x-goog-metageneration"] = str(obj["metageneration"])

    objects.download = download_with_generation  # `objects.get` calls it by name for ?alt=media
    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is download:
                handlers[method] = download_with_generation


def main(argv: list[str]) -> None:
    from gcp_storage_emulator.server import create_server

    port, bucket = int(argv[0]), argv[1]
    _with_generation_headers()
    create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket).run()


if __name__ == "__main__":
    main(sys.argv[1:])
