/*
** libs_fn.h -- the function tables of the real CUDA libraries (libs.h), for code
** compiled with the toolkit's headers (the Makefile adds CUDA_CFLAGS to
** kernels/real/). Each table holds one pointer per function ember calls, named as
** the function and typed from the header's own prototype, so a call reads
** `fns->cudnnGetVersion()` and is checked by the compiler; the pointers come from
** dlsym, never from the link.
**
** To call a new function: add it to its library's list below. X(name, 1) is
** required (the library fails to load without it, with a message naming it);
** X(name, 0) is optional (NULL when the library is older). A header macro that
** renames a function (cudart's `_v2` variants) renames the symbol looked up too,
** since the name is expanded before it is stringified.
*/
#ifndef EMBER_KERNELS_REAL_LIBS_FN_H
#define EMBER_KERNELS_REAL_LIBS_FN_H
#include "libs.h"

/* Which headers this build has: cuBLASLt, cuDNN and NCCL ship apart from the
** runtime, so each may be missing on its own. */
#if defined(__has_include)
#if __has_include(<cuda_runtime_api.h>)
#define EMK_HAVE_CUDART_H 1
#include <cuda_runtime_api.h>
#endif
#if __has_include(<cublasLt.h>) && defined(EMK_HAVE_CUDART_H)
#define EMK_HAVE_CUBLASLT_H 1
#include <cublasLt.h>
#endif
#if __has_include(<cudnn.h>) && defined(EMK_HAVE_CUDART_H)
#define EMK_HAVE_CUDNN_H 1
#include <cudnn.h>
#endif
#if __has_include(<nccl.h>) && defined(EMK_HAVE_CUDART_H)
#define EMK_HAVE_NCCL_H 1
#include <nccl.h>
#endif
#endif

#define EMK_FN_FIELD(f, required) __typeof__(f) *f;

#ifdef EMK_HAVE_CUDART_H
/* The second half is the real runtime's (runtime_real.c): devices, memory,
** streams, events, copies, and kernels loaded from the embedded fatbins as
** cudaLibrary_t / cudaKernel_t (CUDA 12+). */
#define EMK_CUDART_FNS(X) \
  X(cudaRuntimeGetVersion, 1) X(cudaDriverGetVersion, 1) X(cudaGetDeviceCount, 1) \
  X(cudaGetErrorName, 1) X(cudaGetErrorString, 1) \
  X(cudaSetDevice, 1) X(cudaGetLastError, 1) X(cudaGetDeviceProperties, 1) \
  X(cudaMemGetInfo, 1) X(cudaMalloc, 1) X(cudaFree, 1) X(cudaHostAlloc, 1) \
  X(cudaFreeHost, 1) X(cudaStreamCreateWithFlags, 1) X(cudaStreamDestroy, 1) \
  X(cudaStreamSynchronize, 1) X(cudaMemcpyAsync, 1) X(cudaMemcpyPeerAsync, 1) \
  X(cudaMemsetAsync, 1) X(cudaMemset2DAsync, 1) X(cudaLaunchHostFunc, 1) \
  X(cudaEventCreateWithFlags, 1) X(cudaEventRecord, 1) X(cudaEventQuery, 1) \
  X(cudaEventSynchronize, 1) X(cudaEventDestroy, 1) X(cudaStreamWaitEvent, 1) \
  X(cudaLibraryLoadData, 1) X(cudaLibraryUnload, 1) X(cudaLibraryGetKernel, 1) \
  X(cudaLaunchKernel, 1) X(cudaFuncGetParamInfo, 0) X(cudaDeviceCanAccessPeer, 1) \
  X(cudaDeviceEnablePeerAccess, 1) X(cudaStreamBeginCapture, 1) \
  X(cudaStreamEndCapture, 1) X(cudaGraphInstantiate, 1) X(cudaGraphLaunch, 1) \
  X(cudaGraphExecDestroy, 1) X(cudaGraphDestroy, 1) X(cudaPointerGetAttributes, 0) \
  X(cudaLibraryGetKernelCount, 0) X(cudaLibraryEnumerateKernels, 0) X(cudaFuncGetName, 0) \
  X(cudaFuncGetAttributes, 0)
struct emk_cudart_fns { EMK_CUDART_FNS(EMK_FN_FIELD) };
#else
struct emk_cudart_fns { int none; };
#endif

#ifdef EMK_HAVE_CUBLASLT_H
#define EMK_CUBLASLT_FNS(X) \
  X(cublasLtGetVersion, 1) X(cublasLtGetStatusName, 1) X(cublasLtGetStatusString, 1) \
  X(cublasLtCreate, 1) X(cublasLtDestroy, 1) \
  X(cublasLtMatmulDescCreate, 1) X(cublasLtMatmulDescDestroy, 1) \
  X(cublasLtMatmulDescSetAttribute, 1) X(cublasLtMatmulDescGetAttribute, 1) \
  X(cublasLtMatrixLayoutCreate, 1) X(cublasLtMatrixLayoutDestroy, 1) \
  X(cublasLtMatrixLayoutSetAttribute, 1) X(cublasLtMatrixLayoutGetAttribute, 1) \
  X(cublasLtMatmul, 1) X(cublasLtMatmulAlgoGetHeuristic, 1) \
  X(cublasLtMatmulPreferenceCreate, 1) X(cublasLtMatmulPreferenceDestroy, 1) \
  X(cublasLtMatmulPreferenceSetAttribute, 1)
struct emk_cublaslt_fns { EMK_CUBLASLT_FNS(EMK_FN_FIELD) };
#else
struct emk_cublaslt_fns { int none; };
#endif

/* cuDNN 9 keeps the v8 descriptor API (tensor, filter, convolution) in
** libcudnn_ops/libcudnn_cnn behind the libcudnn.so.9 shim, deprecated in favour
** of the graph API but supported: it is what the no-GPU check uses. */
#ifdef EMK_HAVE_CUDNN_H
#define EMK_CUDNN_FNS(X) \
  X(cudnnGetVersion, 1) X(cudnnGetErrorString, 1) X(cudnnGetLastErrorString, 0) \
  X(cudnnCreate, 1) X(cudnnDestroy, 1) \
  X(cudnnCreateTensorDescriptor, 1) X(cudnnSetTensor4dDescriptor, 1) \
  X(cudnnGetTensor4dDescriptor, 1) X(cudnnDestroyTensorDescriptor, 1) \
  X(cudnnCreateFilterDescriptor, 1) X(cudnnSetFilter4dDescriptor, 1) \
  X(cudnnGetFilter4dDescriptor, 1) X(cudnnDestroyFilterDescriptor, 1) \
  X(cudnnCreateConvolutionDescriptor, 1) X(cudnnSetConvolution2dDescriptor, 1) \
  X(cudnnGetConvolution2dDescriptor, 1) X(cudnnGetConvolution2dForwardOutputDim, 1) \
  X(cudnnDestroyConvolutionDescriptor, 1) \
  X(cudnnSetStream, 0) X(cudnnSetConvolutionGroupCount, 0) X(cudnnSetConvolutionMathType, 0) \
  X(cudnnGetConvolutionForwardAlgorithm_v7, 0) \
  X(cudnnGetConvolutionBackwardDataAlgorithm_v7, 0) \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7, 0) X(cudnnConvolutionForward, 0) \
  X(cudnnConvolutionBackwardData, 0) X(cudnnConvolutionBackwardFilter, 0) \
  X(cudnnConvolutionBackwardBias, 0) X(cudnnAddTensor, 0) \
  X(cudnnDeriveBNTensorDescriptor, 0) X(cudnnBatchNormalizationForwardTraining, 0) \
  X(cudnnBatchNormalizationBackward, 0) X(cudnnGetConvolutionMathType, 0) \
  X(cudnnGetConvolutionForwardWorkspaceSize, 0) \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize, 0) \
  X(cudnnGetConvolutionBackwardFilterWorkspaceSize, 0) \
  X(cudnnFindConvolutionForwardAlgorithmEx, 0) \
  X(cudnnFindConvolutionBackwardDataAlgorithmEx, 0) \
  X(cudnnFindConvolutionBackwardFilterAlgorithmEx, 0)
struct emk_cudnn_fns { EMK_CUDNN_FNS(EMK_FN_FIELD) };
#else
struct emk_cudnn_fns { int none; };
#endif

#ifdef EMK_HAVE_NCCL_H
#define EMK_NCCL_FNS(X) \
  X(ncclGetVersion, 1) X(ncclGetUniqueId, 1) X(ncclGetErrorString, 1) \
  X(ncclGetLastError, 0) \
  X(ncclCommInitRankConfig, 1) X(ncclCommGetAsyncError, 1) X(ncclCommAbort, 1) \
  X(ncclCommDestroy, 1) X(ncclCommFinalize, 0) X(ncclGroupStart, 1) X(ncclGroupEnd, 1) \
  X(ncclAllReduce, 1) X(ncclBroadcast, 1) X(ncclAllGather, 1) X(ncclReduceScatter, 1) \
  X(ncclSend, 0) X(ncclRecv, 0)
struct emk_nccl_fns { EMK_NCCL_FNS(EMK_FN_FIELD) };
#else
struct emk_nccl_fns { int none; };
#endif

#endif
