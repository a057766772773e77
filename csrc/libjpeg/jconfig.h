/* jconfig.h for packer's _jpegroi extension: libjpeg-turbo 3.2.0's src/jconfig.h.in with its
 * CMake placeholders filled in by hand for the libjpeg v6.2 ABI (libjpeg.so.62), the ABI of
 * the libjpeg-turbo that Pillow's wheels bundle. Only the struct layouts of jpeglib.h matter
 * here: the extension links no library and loads one at run time (csrc/jpegroi.c).
 * jpeglib.h and jmorecfg.h beside this file are libjpeg-turbo 3.2.0's, unmodified; see
 * README.ijg and LICENSE.md.
 */
#define JPEG_LIB_VERSION  62
#define LIBJPEG_TURBO_VERSION  3.2.0
#define LIBJPEG_TURBO_VERSION_NUMBER  3002000
#define C_ARITH_CODING_SUPPORTED 1
#define D_ARITH_CODING_SUPPORTED 1
#define MEM_SRCDST_SUPPORTED  1
#define WITH_SIMD 1
#ifndef BITS_IN_JSAMPLE
#define BITS_IN_JSAMPLE  8
#endif

#ifdef _WIN32
#undef RIGHT_SHIFT_IS_UNSIGNED
#ifndef __RPCNDR_H__
typedef unsigned char boolean;
#endif
#define HAVE_BOOLEAN
#if !(defined(_BASETSD_H_) || defined(_BASETSD_H))
typedef short INT16;
typedef signed int INT32;
#endif
#define XMD_H
#endif
