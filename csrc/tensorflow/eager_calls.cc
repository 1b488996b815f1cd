// _eager: the Python layer's eager allreduce as one call into C++ (a CPython extension module,
// loaded by bluefog/tensorflow/eager_calls.py from the folder of libbluefog_core; see
// docs/design.md, "Eager calls run their own rounds"). allreduce() takes the output memory,
// runs the request the BluefogAllreduce kernel runs (Runtime::EnqueueAndWait, the calling
// thread driving the rounds, the GIL released) and returns an Output: an object that lends the
// result through the buffer protocol and gives the memory back when the last view of it is
// gone. A failure raises the tf.errors class the kernel's status maps to, with its message.
//
// Everything the Python side must not restate lives here: which outputs come from the core's
// output blocks (kPooledOutputBytes), the alignment TensorFlow needs to share an array, and the
// error classes of the status codes. Includes no TensorFlow header: it runs no kernel.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "core/op_rules.h"
#include "core/request.h"
#include "core/status.h"
#include "core/types.h"
#include "core/validation.h"
#include "runtime/output_blocks.h"
#include "runtime/runtime.h"

namespace bluefog {
namespace {

// TensorFlow shares a numpy array aligned to this many bytes instead of copying it.
constexpr std::align_val_t kAlign{64};

// The tf.errors class of each StatusCode, as the kernels' ToTfStatus (bridge.cc) maps them.
constexpr const char* kErrorClassNames[] = {
    nullptr, "InvalidArgumentError", "FailedPreconditionError", "AbortedError", "InternalError"};
constexpr int kNumErrorClasses = sizeof(kErrorClassNames) / sizeof(kErrorClassNames[0]);
PyObject* g_error_classes[kNumErrorClasses] = {};
PyObject* g_resource_exhausted = nullptr;

std::atomic<long long> g_calls{0};

// The result's memory: an output block of the core (kPooledOutputBytes and more: touched
// memory, the shared heap's when it has room, so peers push their parts straight into it),
// else fresh aligned memory.
struct Output {
  PyObject ob_base;
  void* data;
  Py_ssize_t bytes;
  OutputBlock block;  // constructed in place (PyObject_New leaves the memory raw)
};

PyTypeObject* g_output_type = nullptr;

// Takes `bytes` bytes into `out`; false when none could be had. Needs no GIL.
bool TakeMemory(Output* out, size_t bytes) {
  if (bytes >= kPooledOutputBytes) {
    out->block = TakeOutputBlock(bytes, Runtime::Get().shared_heap());
    out->data = out->block.data;
  } else {
    out->data = ::operator new(bytes == 0 ? 1 : bytes, kAlign, std::nothrow);
  }
  return out->data != nullptr;
}

void OutputDealloc(PyObject* self) {
  Output* out = reinterpret_cast<Output*>(self);
  if (out->block.data != nullptr) {
    GiveOutputBlock(out->block);
  } else if (out->data != nullptr) {
    ::operator delete(out->data, kAlign);
  }
  out->block.~OutputBlock();
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(self);
  Py_DECREF(type);  // instances of a heap type hold a reference to it
}

int OutputGetBuffer(PyObject* self, Py_buffer* view, int flags) {
  Output* out = reinterpret_cast<Output*>(self);
  return PyBuffer_FillInfo(view, self, out->data, out->bytes, /*readonly=*/0, flags);
}

Output* NewOutput(Py_ssize_t bytes) {
  Output* out = PyObject_New(Output, g_output_type);
  if (out == nullptr) return nullptr;
  out->data = nullptr;
  out->bytes = bytes;
  new (&out->block) OutputBlock();
  return out;
}

// Raises `cls` (a tf.errors class) with `message`.
void RaiseStatus(PyObject* cls, const std::string& message) {
  PyObject* text =
      PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "replace");
  if (text == nullptr) return;
  PyObject* error = PyObject_CallFunctionObjArgs(cls, Py_None, Py_None, text, nullptr);
  Py_DECREF(text);
  if (error == nullptr) return;
  PyErr_SetObject(cls, error);
  Py_DECREF(error);
}

// The tf.errors class of a failure's code (InternalError for a code without one).
PyObject* ErrorClass(StatusCode code) {
  const int index = static_cast<int>(code);
  return index > 0 && index < kNumErrorClasses ? g_error_classes[index]
                                               : g_error_classes[kNumErrorClasses - 1];
}

// allreduce(name: str, dtype: int, input, average: bool) -> Output. `input`: a C-contiguous
// object of the buffer protocol (an ndarray), read where it lies; `dtype`: the core's DataType
// value (op_rules.CORE_DTYPES). The same request as the BluefogAllreduce kernel's; the rest of
// the checks are the core's (Runtime::Enqueue), whose errors name the rank, op and tensor.
PyObject* Allreduce(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "allreduce(name, dtype, input, average)");
    return nullptr;
  }
  Py_ssize_t name_size = 0;
  const char* name = PyUnicode_AsUTF8AndSize(args[0], &name_size);
  if (name == nullptr) return nullptr;
  // Refused here, before any memory is taken, with Runtime::Enqueue's message.
  if (std::memchr(name, '\0', static_cast<size_t>(name_size)) != nullptr) {
    Request named;
    named.meta.name.assign(name, static_cast<size_t>(name_size));
    const Status invalid = WithRank(Runtime::Get().info().rank, ValidateRequest(named));
    RaiseStatus(ErrorClass(invalid.code()), invalid.message());
    return nullptr;
  }
  const long dtype = PyLong_AsLong(args[1]);
  if (dtype < 0 || dtype >= kNumDataTypes) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "allreduce: unknown dtype value");
    return nullptr;
  }
  const int average = PyObject_IsTrue(args[3]);
  if (average < 0) return nullptr;
  Py_buffer input;
  if (PyObject_GetBuffer(args[2], &input, PyBUF_ND) != 0) return nullptr;
  Output* out = NewOutput(input.len);
  if (out == nullptr) {
    PyBuffer_Release(&input);
    return nullptr;
  }

  Request request;
  request.meta.op = OpType::kAllreduce;
  request.meta.name.assign(name, static_cast<size_t>(name_size));
  request.meta.dtype = static_cast<DataType>(dtype);
  request.meta.shape.assign(input.shape, input.shape + input.ndim);
  request.meta.average = average != 0;
  request.input = input.buf;
  ++g_calls;
  bool allocated = false;
  Status status;
  Py_BEGIN_ALLOW_THREADS;
  allocated = TakeMemory(out, static_cast<size_t>(input.len));
  if (allocated) {
    request.output = out->data;
    try {
      status = Runtime::Get().EnqueueAndWait(std::move(request), Drive::kUntilDone);
    } catch (const BluefogError& e) {
      status = e.ToStatus();
    } catch (const std::exception& e) {
      status = Status(StatusCode::kInternal, e.what());
    }
  }
  Py_END_ALLOW_THREADS;
  PyBuffer_Release(&input);

  if (!allocated) {
    RaiseStatus(g_resource_exhausted,
                Concat("bluefog: could not allocate an output of ", input.len, " bytes"));
  } else if (!status.ok()) {
    RaiseStatus(ErrorClass(status.code()), status.message());
  } else {
    return reinterpret_cast<PyObject*>(out);
  }
  Py_DECREF(out);
  return nullptr;
}

// enabled() -> bool or None: BLUEFOG_EAGER_C_API as the running core read it at init; None
// before init (and after shutdown), when the op reports that bluefog is not running.
PyObject* Enabled(PyObject*, PyObject*) {
  const Runtime& runtime = Runtime::Get();
  if (!runtime.running()) Py_RETURN_NONE;
  return PyBool_FromLong(runtime.eager_c_api() ? 1 : 0);
}

// calls() -> int: allreduce() calls this process made (for tests).
PyObject* Calls(PyObject*, PyObject*) { return PyLong_FromLongLong(g_calls.load()); }

PyMethodDef g_methods[] = {
    {"allreduce", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(Allreduce)),
     METH_FASTCALL, "allreduce(name, dtype, input, average) -> Output"},
    {"enabled", Enabled, METH_NOARGS, "BLUEFOG_EAGER_C_API of the running core, or None"},
    {"calls", Calls, METH_NOARGS, "allreduce() calls so far"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef g_module = {
    PyModuleDef_HEAD_INIT, "_eager", nullptr, -1, g_methods, nullptr, nullptr, nullptr, nullptr};

// The tf.errors classes, looked up once (TensorFlow is imported before this module).
bool LoadErrorClasses() {
  PyObject* tf = PyImport_ImportModule("tensorflow");
  if (tf == nullptr) return false;
  PyObject* errors = PyObject_GetAttrString(tf, "errors");
  Py_DECREF(tf);
  if (errors == nullptr) return false;
  bool ok = true;
  for (int k = 1; k < kNumErrorClasses && ok; ++k)
    ok = (g_error_classes[k] = PyObject_GetAttrString(errors, kErrorClassNames[k])) != nullptr;
  ok = ok && (g_resource_exhausted = PyObject_GetAttrString(errors, "ResourceExhaustedError"));
  Py_DECREF(errors);
  return ok;
}

}  // namespace
}  // namespace bluefog

PyMODINIT_FUNC PyInit__eager(void) {
  using bluefog::g_output_type;
  static PyType_Slot slots[] = {
      {Py_tp_dealloc, reinterpret_cast<void*>(bluefog::OutputDealloc)},
      {Py_bf_getbuffer, reinterpret_cast<void*>(bluefog::OutputGetBuffer)},
      {Py_tp_doc, const_cast<char*>("An eager allreduce's result, lent by the buffer protocol")},
      {0, nullptr}};
  static PyType_Spec spec = {"bluefog._eager.Output", sizeof(bluefog::Output), 0,
                             Py_TPFLAGS_DEFAULT, slots};
  if (g_output_type == nullptr) {
    g_output_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&spec));
    if (g_output_type == nullptr || !bluefog::LoadErrorClasses()) return nullptr;
  }
  return PyModule_Create(&bluefog::g_module);
}
