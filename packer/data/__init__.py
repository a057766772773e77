"""Training side: datasets over packed outputs. Never imports the conversion side."""
from packer.data.device import DeviceCache
from packer.data.decode import DecodeRandomResizedCrop, PilRandomResizedCrop
from packer.data.datasets import PackedDataset
from packer.data.loader import Loader, LoaderError, LoaderOptions
from packer.data.device import IMAGENET_MEAN, IMAGENET_STD
from packer.data.device import DevicePrefetcher, uint8_collate
from packer.data.streaming import StreamingDataset
from packer.data.decode import DecodeResizeCrop, PilResizeCrop
from packer.data.video import ClipOptions, FrameDataset, PackedVideoDataset

__all__ = ["PackedDataset", "Loader", "LoaderOptions", "LoaderError", "StreamingDataset", "FrameDataset", "PackedVideoDataset", "ClipOptions",
           "DevicePrefetcher", "DeviceCache", "uint8_collate", "DecodeResizeCrop", "PilResizeCrop",
           "DecodeRandomResizedCrop", "PilRandomResizedCrop", "IMAGENET_MEAN",
           "IMAGENET_STD"]
