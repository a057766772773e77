"""The training side: datasets over packed outputs, loaders, decoding and the device.

``packer.data.__all__`` is the public training API (docs/api.md); ``packer.data.multigrid``
holds the multigrid schedule and sampler. Never imports the conversion side (import-linter
checks it). Modules by concept: ``datasets`` (PackedDataset), ``streaming``
(StreamingDataset), ``loader`` (Loader), ``decode`` (decode-time resize and crops),
``device`` (DevicePrefetcher, DeviceCache, normalization, uint8_collate), ``batch_memory``
(DataLoader workers' reused shared-memory batch buffers), ``elastic`` (a resumable
DistributedSampler), ``video`` (clip sampling and the video datasets), ``samplers``
(mmaction2's frame samplers), ``mixing`` (batch class-mixing measures), ``gpu`` (decoding
on the GPU: nvJPEG, NVDEC, and their CPU fallback).
"""
from packer.data.datasets import PackedDataset
from packer.data.decode import DecodeRandomResizedCrop, DecodeResizeCrop, PilRandomResizedCrop, PilResizeCrop
from packer.data.device import (IMAGENET_MEAN, IMAGENET_STD, CacheBatches, DeviceCache, DevicePrefetcher, Normalize,
                                uint8_collate)
from packer.data.elastic import DistributedSampler
from packer.data.gpu import GpuClipDecode, GpuImageDecode
from packer.data.loader import Loader, LoaderError, LoaderOptions
from packer.data.samplers import DenseSampleFrames, SampleFrames, UntrimmedSampleFrames
from packer.data.streaming import StreamingDataset
from packer.data.video import (ClipOptions, ClipPackets, ClipSampling, FrameDataset, PackedVideoDataset, collate_clips,
                               sample_frames)

__all__ = [
    # datasets
    "PackedDataset", "StreamingDataset", "FrameDataset", "PackedVideoDataset",
    # loading and the device
    "Loader", "LoaderOptions", "LoaderError", "DistributedSampler", "DevicePrefetcher", "DeviceCache", "CacheBatches", "Normalize",
    "uint8_collate", "IMAGENET_MEAN", "IMAGENET_STD",
    # decoding
    "DecodeResizeCrop", "DecodeRandomResizedCrop", "PilResizeCrop", "PilRandomResizedCrop",
    # decoding on the GPU
    "GpuImageDecode", "GpuClipDecode", "ClipPackets", "collate_clips",
    # video clips
    "ClipSampling", "ClipOptions", "sample_frames", "SampleFrames", "DenseSampleFrames", "UntrimmedSampleFrames",
]
