// The native op recorder of --backends-determinism.
//
// A boxed fallback on a dispatch key that no torch op has a kernel for
// (kHookKey) sees every op call while a recorder has the key in its thread's
// included set (torch carries that set into autograd's worker threads). It
// records the same ops a Python TorchDispatchMode would see: the outermost op
// of each call chain that is not CompositeImplicitAutograd (composite ops are
// looked through, so `linear` is recorded as the `t` and `addmm` it calls).
// A recorded op runs with the key excluded, so the ops it calls internally
// skip the fallback at no cost; this is what makes the hook cheaper than a
// RecordFunction callback, which boxes every nested call's inputs and outputs.
// Per op it keeps the op, a key per input and a key per output:
//
// * an output is digested when the op returns (on its device; CPU digests are
//   computed in place, CUDA digests stay on the device until finish());
// * a tensor's key is reused while its version counter has not moved; a
//   tensor no op of the run produced (a parameter, data made from Python) is
//   digested at its first use in every run (no key is carried between runs);
//   a view whose storage is too small for it is not read (opaque), and an
//   overlapping view (expand) is digested by the memory it covers;
// * a generator argument is keyed by its state at call time;
// * views are keyed by the view op and its inputs' keys, uninitialised memory
//   (empty, new_empty, ...) and workspaces of fused kernels by dtype and shape;
//   reads of uninitialised memory are tracked through views and in-place ops.
//
// finish() turns the record into Python rows of the same shape the Python
// recorder (pytest_backends/determinism/recorder.py) produces, so one
// comparison serves both.
#include "recorder.h"

#include "digest.h"
#include "digest_op.h"

#include <ATen/ATen.h>
#include <ATen/MapAllocator.h>
#include <ATen/NestedTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <tuple>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace pytest_backends {
namespace {

namespace py = pybind11;

constexpr const char* kAlertText = "does not have a deterministic implementation";

// --- what is known about an op, once per process ---------------------------------

struct OpInfo {
  std::string name;      // "aten::add" (no overload)
  std::string overload;  // checked against the call, so a reused address cannot mislead
  uint64_t name_hash = 0;
  bool composite = false;
  bool pure_view = false;
  bool uninitialized = false;
  bool overwrites = false;
  bool rebinds = false;  // set_: the tensor now shows other memory, keyed where first read
  bool seeded = false;   // draws from a generator (the default one unless one is passed)
  bool marker = false;   // marks a range (record_function) and computes nothing: not recorded
  std::vector<int> workspaces;
  std::vector<int> written;  // argument positions the op writes to
  std::vector<int> outs;     // out= arguments
};

// The op tables (which ops make uninitialised memory, overwrite without reading,
// point a tensor at other memory, return workspaces, only mark a range), set once from Python
// (pytest_backends/determinism/op_tables.py, the one source both recorders use)
// before anything is recorded.
struct OpTables {
  std::unordered_set<std::string> uninitialized;
  std::unordered_set<std::string> overwrites;
  std::unordered_set<std::string> rebinds;
  std::unordered_map<std::string, std::vector<int>> workspaces;
  std::unordered_set<std::string> marker_namespaces;
  bool set = false;
};

OpTables& op_tables() {
  static OpTables tables;
  return tables;
}

std::mutex g_info_mutex;
std::unordered_map<const char*, std::unique_ptr<OpInfo>> g_infos;
std::vector<std::unique_ptr<OpInfo>> g_retired;

const OpInfo& info_of_locked(const c10::OperatorHandle& op);

// Per thread, so the common lookup takes no lock.
const OpInfo& info_of(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const char*, const OpInfo*> cache;
  const c10::OperatorName& name = op.operator_name();
  const char* key = name.name.c_str();
  auto it = cache.find(key);
  if (it != cache.end() && it->second->name == name.name &&
      it->second->overload == name.overload_name) {
    return *it->second;
  }
  const OpInfo& info = info_of_locked(op);
  cache[key] = &info;
  return info;
}

const OpInfo& info_of_locked(const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.operator_name();
  const char* key = name.name.c_str();
  std::lock_guard<std::mutex> lock(g_info_mutex);
  auto it = g_infos.find(key);
  if (it != g_infos.end() && it->second->name == name.name &&
      it->second->overload == name.overload_name) {
    return *it->second;
  }
  auto info = std::make_unique<OpInfo>();
  info->name = name.name;
  info->overload = name.overload_name;
  info->name_hash = std::hash<std::string>{}(info->name);
  info->composite = op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  info->seeded = op.hasTag(at::Tag::nondeterministic_seeded);
  const c10::FunctionSchema& schema = op.schema();
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* alias = args[i].alias_info();
    if (alias != nullptr && alias->isWrite()) {
      info->written.push_back(static_cast<int>(i));
      if (args[i].is_out() || args[i].kwarg_only()) {
        info->outs.push_back(static_cast<int>(i));
      }
    }
  }
  bool view = false;
  for (const auto& ret : schema.returns()) {
    if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) {
      view = true;
    }
  }
  info->pure_view = view && info->written.empty();
  const OpTables& tables = op_tables();
  info->uninitialized = tables.uninitialized.count(info->name) > 0;
  info->overwrites = tables.overwrites.count(info->name) > 0;
  info->rebinds = tables.rebinds.count(info->name) > 0;
  const size_t colons = info->name.find("::");
  info->marker = colons != std::string::npos &&
                 tables.marker_namespaces.count(info->name.substr(0, colons)) > 0;
  const auto ws = tables.workspaces.find(info->name);
  if (ws != tables.workspaces.end()) {
    info->workspaces = ws->second;
  }
  const OpInfo& ref = *info;
  if (it != g_infos.end()) {
    // Another op at a reused address: the old entry may still be referenced.
    g_retired.push_back(std::move(it->second));
  }
  g_infos[key] = std::move(info);
  return ref;
}

// --- keys ----------------------------------------------------------------------

enum class KeyKind : uint8_t {
  Digest,
  Pending,
  View,
  Uninitialized,
  Workspace,
  Opaque,
  Empty,
  Value,  // a non-tensor output (``item()``, ``equal``): compared by value
  Unread,  // a tensor an overwrite writes without reading it: keyed by dtype and shape
  Rebound  // set_'s output: its new memory is keyed where an op first reads it
};

// Small and flat: a run makes one or more per op, and finish() walks them all.
struct Key {
  uint64_t h0 = 0;
  uint64_t h1 = 0;
  // View: the op that made it; Pending: index into Recorder::pending_; Value: into
  // Recorder::values_; the kinds keyed by dtype and shape: into Recorder::shapes_.
  int64_t ref = -1;
  const c10::StorageImpl* storage = nullptr;  // external digests
  uint64_t extra = 0;  // an overlapping view's sizes and strides, mixed into its digest
  int32_t index = 0;   // view: which output of that op
  KeyKind kind = KeyKind::Opaque;
  bool external = false;
  at::ScalarType dtype = at::ScalarType::Undefined;
};

struct ShapeInfo {
  c10::SmallVector<int64_t, 5> shape;
  const char* reason = "";
  // A nested tensor has no sizes: `shape` holds its components' sizes, row by row,
  // `nested_dim` per component (0: a plain shape).
  int64_t nested_dim = 0;
};

// What an unreadable tensor is, in the words the Python recorder uses (its layout).
const char* unreadable_reason(const at::Tensor& t) {
  if (t.is_meta()) {
    return "meta";
  }
  if (t.is_nested()) {
    return "nested";
  }
  switch (t.layout()) {
    case at::kSparse:
      return "torch.sparse_coo";
    case at::kSparseCsr:
      return "torch.sparse_csr";
    case at::kSparseCsc:
      return "torch.sparse_csc";
    case at::kSparseBsr:
      return "torch.sparse_bsr";
    case at::kSparseBsc:
      return "torch.sparse_bsc";
    case at::kMkldnn:
      return "torch._mkldnn";
    default:
      return "unreadable";
  }
}

struct Known {
  c10::weak_intrusive_ptr<c10::TensorImpl> weak;
  int64_t version;
  int64_t key;
};

// A key carried from the previous run, for a tensor from outside the run whose bytes
// are proven unchanged since: the same tensor (the weak references keep both
// addresses from being reused), its version counter not moved, the same storage,
// offset, sizes and strides, no recorded op writing that storage (through any alias,
// such as ``.data``) and the storage not shared with something outside torch.
struct Carried {
  c10::weak_intrusive_ptr<c10::TensorImpl> weak;
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  int64_t version;
  int64_t offset;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  Key key;
};

// An input: a tensor's key, a plain value, or a list of inputs. Kept flat in
// Recorder::slots_, a list followed by its items (and theirs).
struct Slot {
  enum Kind : uint8_t { Tensor, NoTensor, Value, List } kind = Value;
  uint32_t span = 0;  // a list: how many slots after it are its items and theirs
  int64_t ref = -1;    // Tensor: the key; Value: index into Recorder::values_
};

struct OpRecord {
  const OpInfo* info = nullptr;
  uint32_t inputs_begin = 0;  // slots_[inputs_begin, inputs_end): the inputs, in order
  uint32_t inputs_end = 0;
  uint32_t outputs_begin = 0;  // outputs_[outputs_begin, outputs_end): output keys
  uint32_t outputs_end = 0;
  int32_t taint = -1;  // index into Recorder::origins_
  c10::DeviceType device = c10::DeviceType::CPU;
  at::ScalarType dtype = at::ScalarType::Undefined;
  bool has_device = false;
  bool raised = false;
  bool alerted = false;
};

// A census key: (op, device type, dtype), -1 where the op touched no tensor.
struct CensusKey {
  const OpInfo* info;
  int device;
  int dtype;
  bool operator==(const CensusKey& o) const {
    return info == o.info && device == o.device && dtype == o.dtype;
  }
};

struct CensusKeyHash {
  size_t operator()(const CensusKey& k) const {
    return std::hash<const void*>{}(k.info) ^ (static_cast<size_t>(k.device + 1) << 20) ^
           (static_cast<size_t>(k.dtype + 1) << 28);
  }
};

// Forwards warnings to the handler it replaced and notes determinism alerts.
class AlertHandler : public c10::WarningHandler {
 public:
  explicit AlertHandler(c10::WarningHandler* previous) : previous_(previous) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find(kAlertText) != std::string::npos) {
      alerted = true;
    }
    if (previous_ != nullptr) {
      previous_->process(warning);
    }
  }
  bool alerted = false;
  c10::WarningHandler* previous_;
};

// What one recorded op carries from before its kernel to after it.
struct OpContext {
  int64_t index = -1;
  const OpInfo* info = nullptr;
  std::string where;  // " (file:line)" of an op making uninitialised memory
  c10::SmallVector<at::Tensor, 2> written;
  std::optional<AlertHandler> alerts;
  int32_t passes = -1;  // an overwrite copying uninitialised memory on: its origin
  bool outside = false;  // the op read memory shared outside torch: its caller is noted
};

const c10::StorageImpl* storage_of(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->has_storage() || impl->is_python_dispatch()) {
    return nullptr;
  }
  return impl->storage().unsafeGetStorageImpl();
}

// Whether a storage lives in memory shared with other processes: what Python's
// UntypedStorage.is_shared() says for CPU storages (Tensor.share_memory_(),
// Module.share_memory(), torch.multiprocessing). Another process may write it at any
// time, moving no version counter here. The file_descriptor strategy maps it with
// at::MapAllocator; the file_system strategy with libshm's THManagedMapAllocator,
// looked up in the already loaded libshm (none found: that strategy is not seen).
bool process_shared(const c10::StorageImpl* storage) {
  if (storage == nullptr || storage->device_type() != c10::DeviceType::CPU) {
    return false;
  }
  const c10::DataPtr& ptr = storage->data_ptr();
  if (at::MapAllocator::fromDataPtr(ptr) != nullptr) {
    return true;
  }
  using FromDataPtr = void* (*)(const c10::DataPtr&);
  static const FromDataPtr managed = []() -> FromDataPtr {
    void* lib = dlopen("libshm.so", RTLD_LAZY | RTLD_NOLOAD);
    if (lib == nullptr) {
      return nullptr;
    }
    return reinterpret_cast<FromDataPtr>(
        dlsym(lib, "_ZN21THManagedMapAllocator11fromDataPtrERKN3c107DataPtrE"));
  }();
  return managed != nullptr && managed(ptr) != nullptr;
}

// Elements of memory a strided view reaches, from its first to its last (numel > 0).
int64_t covered_span(const at::Tensor& t) {
  int64_t span = 1;
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  for (size_t d = 0; d < sizes.size(); ++d) {
    span += (sizes[d] - 1) * strides[d];
  }
  return span;
}

// Whether the digest may read t: a plain strided tensor whose storage holds every
// byte its view reaches (a storage freed with resize_(0) does not: reading it faults).
// The address of t's storage memory (nullptr without one): what Python's
// untyped_storage().data_ptr() gives, the identity of memory shared with NumPy.
const void* data_of(const at::Tensor& t) {
  const c10::StorageImpl* storage = storage_of(t);
  return storage == nullptr ? nullptr : storage->data();
}

bool readable(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (impl->is_python_dispatch() || t.layout() != at::kStrided || t.is_quantized()) {
    return false;
  }
  const auto keys = impl->key_set();
  if (keys.has(c10::DispatchKey::Functionalize) || t.is_meta() || !impl->has_storage() ||
      t.is_nested()) {
    return false;  // a nested tensor has no strides to check its storage against
  }
  if (t.numel() == 0) {
    return true;
  }
  const c10::Storage& storage = impl->storage();
  const int64_t need = (impl->storage_offset() + covered_span(t)) * t.element_size();
  return storage.data() != nullptr && static_cast<int64_t>(storage.nbytes()) >= need;
}

// A wrapper tensor whose ops run in Python (__torch_dispatch__), where the hook is off.
bool python_wrapper(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return t.defined() && t.unsafeGetTensorImpl()->is_python_dispatch();
  }
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) {
      if (t.defined() && t.unsafeGetTensorImpl()->is_python_dispatch()) {
        return true;
      }
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (python_wrapper(e)) {
        return true;
      }
    }
  }
  return false;
}

// A tensor that wraps others (a tensor subclass, vmap's batched tensor, grad's wrapper,
// functionalization, nested tensors): ops on it are looked through to the ops they
// run on the wrapped tensors, as a Python dispatch mode sees them.
bool wrapper(const c10::IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      return false;
    }
    const auto keys = t.unsafeGetTensorImpl()->key_set();
    return keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::FuncTorchBatched) ||
           keys.has(c10::DispatchKey::FuncTorchGradWrapper) ||
           keys.has(c10::DispatchKey::Functionalize) ||
           keys.has(c10::DispatchKey::BatchedNestedTensor) || t.is_nested();
  }
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) {
      if (wrapper(c10::IValue(t))) {
        return true;
      }
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (wrapper(e)) {
        return true;
      }
    }
  }
  return false;
}

// Dynamo, AOTAutograd and Inductor trace under these modes: their ops are the
// compiler's, not the test's (the compiled code's own dispatcher calls are recorded).
bool compiling() {
  using c10::impl::TorchDispatchModeKey;
  using c10::impl::TorchDispatchModeTLS;
  if (!TorchDispatchModeTLS::any_modes_set()) {
    return false;  // the common case, without copying a mode's shared_ptr
  }
  return TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FAKE).has_value() ||
         TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::PROXY).has_value() ||
         TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FUNCTIONAL).has_value();
}

// A FakeTensor or FunctionalTensor: the compiler's tracing tensors hold no data, so
// their ops compute nothing the test can observe (the rule of compiling() above, for
// the tensors a tracer handles outside its mode). Call with the GIL held.
bool tracing_tensor(PyObject* obj) {
  static PyObject* classes = [] {
    PyObject* found = PyTuple_New(0);
    try {
      py::tuple both = py::make_tuple(
          py::module_::import("torch._subclasses.fake_tensor").attr("FakeTensor"),
          py::module_::import("torch._subclasses.functional_tensor").attr("FunctionalTensor"));
      Py_DECREF(found);
      found = both.release().ptr();
    } catch (const std::exception&) {
      PyErr_Clear();
    }
    return found;  // kept for the life of the process
  }();
  const int result = PyObject_IsInstance(obj, classes);
  if (result < 0) {
    PyErr_Clear();
    return false;
  }
  return result == 1;
}

// Guards one recorder's state against autograd's worker threads; uncontended in
// practice (the calling thread waits for them), so a spin is cheaper than a mutex.
class SpinLock {
 public:
  void lock() {
    while (flag_.test_and_set(std::memory_order_acquire)) {
    }
  }
  void unlock() { flag_.clear(std::memory_order_release); }

 private:
  std::atomic_flag flag_ = ATOMIC_FLAG_INIT;
};

// Dead tensors' entries are pruned once this many are known: each entry's weak
// reference keeps a dead TensorImpl's memory allocated, and fresh memory for every new
// tensor costs more than the pruning (measured on a loop of tiny ops).
constexpr size_t kPruneAt = 256;

// The hook's dispatch key: above autograd (so ops are seen as called, before
// autograd and CPU autocast), no torch op has a kernel for it and torch registers
// no fallback for it (it is reserved for torchdistx's deferred initialisation).
constexpr c10::DispatchKey kHookKey = c10::DispatchKey::DeferredInit;

class Recorder;
std::mutex g_active_mutex;
std::atomic<Recorder*> g_active{nullptr};
// Ops the recorder calls itself, and ops nested in a recorded op, are not recorded;
// the key's exclusion already skips them, this also covers a kernel that resets the
// thread's dispatch key sets (functorch's layers do).
thread_local int t_inside = 0;

void record_op(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);

// Registers the fallback once per process; "" when it is in place, else why not.
const std::string& hook_error() {
  static const std::string error = [] {
    auto& dispatcher = c10::Dispatcher::singleton();
    if (dispatcher.hasBackendFallbackForDispatchKey(kHookKey)) {
      return std::string("another library registered a fallback for dispatch key ") +
             c10::toString(kHookKey);
    }
    try {
      // Never deregistered: the dispatcher may be torn down before this library.
      new c10::RegistrationHandleRAII(dispatcher.registerFallback(
          kHookKey, c10::KernelFunction::makeFromBoxedFunction<&record_op>(),
          "pytest_backends native op recorder"));
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  return error;
}

class Recorder {
 public:
  explicit Recorder(const Recorder* previous, bool carry = true) {
    if (previous != nullptr) {
      if (carry) {
        carried_ = previous->carry_out_;
      }
      // The next run of a test records about as many ops: no regrowth while recording.
      ops_.reserve(previous->ops_.size() + 16);
      keys_.reserve(previous->keys_.size() + 16);
      slots_.reserve(previous->slots_.size() + 16);
      outputs_.reserve(previous->outputs_.size() + 16);
      values_.reserve(previous->values_.size() + 16);
      // Only keys proven still true are carried over (see Carried); any other tensor
      // from outside the run is keyed by its contents at its first use in every run.
    }
  }

  ~Recorder() { stop(); }

  void start() {
    const std::string& error = hook_error();
    TORCH_CHECK(error.empty(), "the native op recorder cannot hook the dispatcher: ", error);
    TORCH_CHECK(op_tables().set,
                "the native op recorder has no op tables (native_module() sets them)");
    std::lock_guard<std::mutex> lock(g_active_mutex);
    TORCH_CHECK(g_active == nullptr, "another native op recorder is active on this process");
    TORCH_CHECK(!finished_, "a native op recorder records one run");
    g_active = this;
    was_excluded_ = c10::impl::tls_is_dispatch_key_excluded(kHookKey);
    c10::impl::tls_set_dispatch_key_excluded(kHookKey, false);
    c10::impl::tls_set_dispatch_key_included(kHookKey, true);
    thread_ = std::this_thread::get_id();
    hooked_ = true;
  }

  void stop() {
    std::lock_guard<std::mutex> lock(g_active_mutex);
    // Another thread's key sets are out of reach; there the fallback, finding no
    // active recorder, only passes ops on until a recorder stops on that thread (the
    // key is the recorder's alone, so it leaves it out of the included set).
    if (hooked_ && thread_ == std::this_thread::get_id()) {
      c10::impl::tls_set_dispatch_key_included(kHookKey, false);
      c10::impl::tls_set_dispatch_key_excluded(kHookKey, was_excluded_);
    }
    hooked_ = false;
    if (g_active == this) {
      g_active = nullptr;
    }
  }

  void set_locator(py::object locator) { locator_ = std::move(locator); }

  void set_observer(py::object observer) { observer_ = std::move(observer); }

  // (fingerprint, census keys, first uses, failure). Two runs with the same
  // fingerprint recorded the same ops with the same keys; rows() gives the record.
  py::tuple finish() {
    stop();
    std::lock_guard<SpinLock> lock(mutex_);
    resolve_pending();
    finished_ = true;
    carry_out();
    known_.clear();
    carried_.clear();
    std::vector<uint64_t> key_memo(keys_.size(), 0);
    std::vector<uint64_t> input_memo(ops_.size(), 0);
    uint64_t fp = kSeed0;
    ska::flat_hash_map<CensusKey, bool, CensusKeyHash> census;  // -> alerted
    for (size_t i = 0; i < ops_.size(); ++i) {
      const OpRecord& r = ops_[i];
      fp = chain(fp, r.info->name_hash);
      fp = chain(fp, r.has_device ? static_cast<uint64_t>(r.device) + 1 : 0);
      fp = chain(fp, static_cast<uint64_t>(r.dtype));
      fp = chain(fp, inputs_hash(static_cast<int64_t>(i), key_memo, input_memo));
      fp = chain(fp, r.raised ? 1 : 2 + (r.outputs_end - r.outputs_begin));
      for (uint32_t j = r.outputs_begin; j < r.outputs_end; ++j) {
        fp = chain(fp, key_hash(outputs_[j], key_memo, input_memo));
      }
      fp = chain(fp, r.alerted ? 1 : 0);
      fp = chain(fp, r.taint >= 0 ? std::hash<std::string>{}(origins_[static_cast<size_t>(r.taint)])
                                  : 0);
      bool& alerted = census[CensusKey{r.info, r.has_device ? static_cast<int>(r.device) : -1,
                                       r.has_device ? static_cast<int>(r.dtype) : -1}];
      alerted = alerted || r.alerted;
    }
    py::list keys;
    for (const auto& entry : census) {
      const OpInfo* info = entry.first.info;
      const int device = entry.first.device;
      const int dtype = entry.first.dtype;
      py::object dev = py::none();
      py::object dt = py::none();
      if (device >= 0) {
        dev = py::str(c10::DeviceTypeName(static_cast<c10::DeviceType>(device), true));
        if (static_cast<at::ScalarType>(dtype) != at::ScalarType::Undefined) {
          dt = dtype_object(static_cast<at::ScalarType>(dtype));
        }
      }
      keys.append(py::make_tuple(info->name, dev, dt, entry.second));
    }
    py::list uses;
    for (size_t i = 0; i < first_uses_.size(); ++i) {
      if (!first_use_refs_[i].expired()) {  // dead ones (wrapped Python numbers) say nothing
        uses.append(py::make_tuple(first_uses_[i].first,
                                   reinterpret_cast<uintptr_t>(first_uses_[i].second)));
      }
    }
    py::object failure = failure_.empty() ? py::object(py::none()) : py::str(failure_);
    return py::make_tuple(py::int_(fp), keys, uses, failure);
  }

  // The keys the next run may reuse: digests of tensors from outside the run that
  // are still alive, unchanged and unwritten (see Carried).
  void carry_out() {
    carry_out_.clear();
    for (const auto& entry : known_) {
      const Known& known = entry.second;
      const Key& key = keys_[static_cast<size_t>(known.key)];
      if (key.kind != KeyKind::Digest || !key.external || key.storage == nullptr ||
          written_.count(key.storage) > 0) {
        continue;
      }
      c10::intrusive_ptr<c10::TensorImpl> impl = known.weak.lock();
      if (!impl || !impl->has_storage() || impl->is_python_dispatch() ||
          static_cast<int64_t>(impl->version_counter().current_version()) != known.version) {
        continue;
      }
      const c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
      if (storage != key.storage || !storage->resizable() ||
          shared_.count(storage->data()) > 0 || process_shared(storage)) {
        continue;
      }
      Carried c{known.weak,
                impl->storage().getWeakStorageImpl(),
                known.version,
                impl->storage_offset(),
                c10::SmallVector<int64_t, 5>(impl->sizes().begin(), impl->sizes().end()),
                c10::SmallVector<int64_t, 5>(impl->strides().begin(), impl->strides().end()),
                key};
      carry_out_.emplace(impl.get(), std::move(c));
    }
  }

  // The key carried for t from the previous run when it is proven still true, else -1.
  int64_t carried_key(const at::Tensor& t, c10::TensorImpl* impl) {
    auto it = carried_.find(impl);
    if (it == carried_.end()) {
      return -1;
    }
    const Carried& c = it->second;
    const c10::StorageImpl* storage = storage_of(t);
    const bool same = !c.weak.expired() && !c.storage.expired() &&
                      storage == c.storage._unsafe_get_target() &&
                      written_.count(storage) == 0 &&
                      static_cast<int64_t>(impl->version_counter().current_version()) ==
                          c.version &&
                      t.storage_offset() == c.offset && t.sizes().equals(c.sizes) &&
                      t.strides().equals(c.strides);
    if (!same) {
      carried_.erase(it);
      return -1;
    }
    return add_key(c.key);
  }

  // Note a storage (by its data pointer) as shared with something outside torch.
  void add_shared(uintptr_t data) {
    std::lock_guard<SpinLock> lock(mutex_);
    shared_.insert(reinterpret_cast<const void*>(data));
  }

  // Indices of the ops that read memory shared outside torch (read again there).
  std::vector<int64_t> outside() {
    std::lock_guard<SpinLock> lock(mutex_);
    return outside_;
  }

  // (op index, " (file:line)") of the ops that read memory shared outside torch.
  std::vector<std::pair<int64_t, std::string>> outside_places() {
    std::lock_guard<SpinLock> lock(mutex_);
    return outside_places_;
  }

  // The record, op by op, as recorder.py's OpCall fields (after finish()).
  py::list rows() {
    std::lock_guard<SpinLock> lock(mutex_);
    std::vector<py::object> key_objs(keys_.size());
    std::vector<py::object> input_objs(ops_.size());
    py::list rows;
    for (size_t i = 0; i < ops_.size(); ++i) {
      const OpRecord& r = ops_[i];
      py::object device = py::none();
      py::object dtype = py::none();
      if (r.has_device) {
        device = py::str(c10::DeviceTypeName(r.device, /*lower_case=*/true));
        if (r.dtype != at::ScalarType::Undefined) {
          dtype = dtype_object(r.dtype);
        }
      }
      py::object inputs = op_inputs(static_cast<int64_t>(i), key_objs, input_objs);
      py::tuple outputs;
      if (r.raised) {
        outputs = py::make_tuple(py::make_tuple("raised", "exception"));
      } else {
        outputs = py::tuple(r.outputs_end - r.outputs_begin);
        for (uint32_t j = r.outputs_begin; j < r.outputs_end; ++j) {
          outputs[j - r.outputs_begin] = key_object(outputs_[j], key_objs, input_objs);
        }
      }
      py::object tainted = py::none();
      if (r.taint >= 0) {
        tainted = py::str(origins_[static_cast<size_t>(r.taint)]);
      }
      rows.append(py::make_tuple(r.info->name, device, dtype, inputs, outputs, r.alerted,
                                 tainted));
    }
    return rows;
  }

  // The Python type of the first __torch_dispatch__ wrapper whose ops ran unseen, or None.
  py::object blind() {
    std::lock_guard<SpinLock> lock(mutex_);
    return blind_.empty() ? py::object(py::none()) : py::object(py::str(blind_));
  }

  // Notes a __torch_dispatch__ wrapper among an op's inputs: its ops run unseen.
  void note_blind(c10::ArrayRef<c10::IValue> inputs) {
    {
      std::lock_guard<SpinLock> lock(mutex_);
      if (!blind_.empty() || finished_) {
        return;
      }
    }
    std::string name;
    for (const auto& v : inputs) {
      if (v.isTensor() && v.toTensor().defined() &&
          v.toTensor().unsafeGetTensorImpl()->is_python_dispatch()) {
        py::gil_scoped_acquire gil;
        PyObject* obj = THPVariable_Wrap(v.toTensor());
        if (obj == nullptr) {
          PyErr_Clear();
          name = "a __torch_dispatch__ subclass";
          break;
        }
        const bool tracing = tracing_tensor(obj);
        if (!tracing) {
          name = Py_TYPE(obj)->tp_name;
        }
        Py_DECREF(obj);
        if (!tracing) {
          break;
        }
      }
    }
    if (name.empty()) {
      return;  // only the compiler's tracing tensors: nothing of the test ran unseen
    }
    std::lock_guard<SpinLock> lock(mutex_);
    if (blind_.empty()) {
      blind_ = name;
    }
  }

  // Marks the last op that raised as a determinism alert (the run's exception said so).
  void note_alert() {
    std::lock_guard<SpinLock> lock(mutex_);
    for (auto it = ops_.rbegin(); it != ops_.rend(); ++it) {
      if (it->raised) {
        it->alerted = true;
        return;
      }
    }
  }


 private:
  friend void record_op(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                        torch::jit::Stack* stack);

  // After the op's kernel (or its exception): its outputs are keyed and the observer told.
  void after_op(const OpInfo& info, OpContext& ctx, c10::ArrayRef<c10::IValue> outputs,
                bool raised) {
    if (ctx.alerts) {
      c10::WarningUtils::set_warning_handler(ctx.alerts->previous_);
    }
    if (ctx.index < 0) {
      return;
    }
    try {
      if (!raised && info.uninitialized) {
        // Python runs here, before the recorder's lock is taken: a thread holding the
        // GIL may be waiting for that lock.
        ctx.where = where();
      }
      if (ctx.outside) {
        std::string place = where();
        std::lock_guard<SpinLock> lock(mutex_);
        outside_places_.emplace_back(ctx.index, std::move(place));
      }
      end_op(ctx, outputs, raised);
    } catch (const std::exception& e) {
      fail(e.what());
    }
    if (!raised && observer_ && !observer_.is_none()) {
      // After the op: its autograd node exists, as a dispatch mode would see it.
      py::gil_scoped_acquire gil;
      try {
        observer_(ctx.index, info.name);
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("pytest_backends native recorder observer");
      }
    }
  }

  void fail(const char* what) {
    std::lock_guard<SpinLock> lock(mutex_);
    if (failure_.empty()) {
      std::string text = what;
      const auto nl = text.find('\n');
      failure_ = "native recorder: " + text.substr(0, nl);
    }
    broken_ = true;
  }

  void begin_op(const OpInfo& info, c10::ArrayRef<c10::IValue> inputs, OpContext& ctx) {
    std::lock_guard<SpinLock> lock(mutex_);
    if (broken_ || finished_) {
      return;
    }
    const int64_t index = static_cast<int64_t>(ops_.size());
    OpRecord& rec = ops_.emplace_back();  // built in place; nothing else grows ops_ here
    rec.info = &info;
    for (int w : info.written) {
      if (static_cast<size_t>(w) < inputs.size()) {
        collect_tensors(inputs[static_cast<size_t>(w)], ctx.written);
      }
    }
    const bool unread = info.overwrites || (!tainted_.empty() && info.pure_view);
    rec.inputs_begin = static_cast<uint32_t>(slots_.size());
    slot_taint_ = -1;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const bool written = std::find(info.written.begin(), info.written.end(),
                                     static_cast<int>(i)) != info.written.end();
      // An overwrite does not read what it writes; views and overwrites read no data, so
      // memory no op wrote is keyed by shape there, and an overwrite copying such
      // memory passes its taint on (circular padding copies parts of a partly filled
      // buffer into it).
      add_slot(inputs[i], index,
               info.overwrites && written ? kWritten : (unread ? kUnreadIfTainted : kRead));
    }
    if (info.seeded) {
      add_default_generator(inputs);
    }
    ctx.outside = !outside_.empty() && outside_.back() == index;
    for (const at::Tensor& w : ctx.written) {
      const c10::StorageImpl* storage = storage_of(w);
      if (storage != nullptr) {
        written_.insert(storage);  // a carried key on this storage is no longer proof
      }
    }
    rec.inputs_end = static_cast<uint32_t>(slots_.size());
    if (info.overwrites && slot_taint_ >= 0) {
      rec.taint = static_cast<int32_t>(slot_taint_);
      ctx.passes = static_cast<int32_t>(slot_taint_);
    }
    if (!tainted_.empty() && !unread) {
      rec.taint = reads_taint(info, inputs);
    }
    for (const auto& v : inputs) {
      if (first_tensor(v, rec)) {
        break;
      }
    }
    if (at::globalContext().deterministicAlgorithms() &&
        at::globalContext().deterministicAlgorithmsWarnOnly()) {
      ctx.alerts.emplace(c10::WarningUtils::get_warning_handler());
      c10::WarningUtils::set_warning_handler(&*ctx.alerts);
    }
    ctx.index = index;
    ctx.info = &info;
  }

  void end_op(OpContext& ctx, c10::ArrayRef<c10::IValue> outputs, bool raised) {
    std::lock_guard<SpinLock> lock(mutex_);
    if (broken_ || finished_ || ctx.index < 0 || static_cast<size_t>(ctx.index) >= ops_.size()) {
      return;
    }
    OpRecord& rec = ops_[static_cast<size_t>(ctx.index)];
    const OpInfo& info = *rec.info;
    rec.outputs_begin = rec.outputs_end = static_cast<uint32_t>(outputs_.size());
    if (ctx.alerts && ctx.alerts->alerted) {
      rec.alerted = true;
    }
    if (raised) {
      rec.raised = true;
      return;
    }
    bool device_from_output = false;
    auto record_output = [&](const at::Tensor& t, size_t j) {
      if (!device_from_output) {
        rec.device = t.device().type();
        rec.dtype = t.scalar_type();
        rec.has_device = true;
        device_from_output = true;
      }
      int64_t key;
      if (info.uninitialized) {
        key = uninitialized(t, info, ctx.where);
      } else if (ctx.passes >= 0) {
        key = pass_taint(t, ctx.passes);
      } else if (info.rebinds) {
        known_.erase(t.unsafeGetTensorImpl());  // its next reader digests the new memory
        outputs_.push_back(shape_key(t, KeyKind::Rebound));
        return;
      } else if (info.pure_view) {
        Key k;
        k.kind = KeyKind::View;
        k.ref = ctx.index;
        k.index = static_cast<int32_t>(j);
        key = add_key(std::move(k));
      } else if (std::find(info.workspaces.begin(), info.workspaces.end(),
                           static_cast<int>(j)) != info.workspaces.end()) {
        key = shape_key(t, KeyKind::Workspace);
      } else {
        key = digest(t, false);
      }
      remember(t, key);
      outputs_.push_back(key);
    };
    if (outputs.size() == 1 && outputs[0].isTensor() && outputs[0].toTensor().defined()) {
      record_output(outputs[0].toTensor(), 0);  // the common case: one tensor, no copy
    } else {
      c10::SmallVector<at::Tensor, 4> tensors;
      for (const auto& v : outputs) {
        collect_tensors(v, tensors);
      }
      if (tensors.empty()) {
        tensors.assign(ctx.written.begin(), ctx.written.end());  // in-place ops returning nothing
      }
      for (size_t j = 0; j < tensors.size(); ++j) {
        record_output(tensors[j], j);
      }
      if (tensors.empty()) {
        for (const auto& v : outputs) {
          if (!v.isNone()) {  // a Python number or other value: its value is the result
            Key k;
            k.kind = KeyKind::Value;
            k.ref = static_cast<int64_t>(values_.size());
            values_.push_back(v);
            outputs_.push_back(add_key(k));
          }
        }
      }
    }
    rec.outputs_end = static_cast<uint32_t>(outputs_.size());
    if (info.overwrites && !tainted_.empty() && ctx.passes < 0) {
      clear_taint(ctx.written);
    }
  }

  int64_t pass_taint(const at::Tensor& t, int32_t origin) {
    const c10::StorageImpl* storage = storage_of(t);
    if (storage != nullptr && t.numel() > 0) {
      auto it = tainted_.find(storage);
      if (it == tainted_.end() || it->second.first.expired()) {
        tainted_.insert_or_assign(storage,
                                  std::make_pair(t.storage().getWeakStorageImpl(),
                                                 static_cast<int64_t>(origin)));
      }
    }
    return shape_key(t, KeyKind::Uninitialized);
  }

  template <typename Out>
  static void collect_tensors(const c10::IValue& v, Out& out) {
    if (v.isTensor()) {
      if (v.toTensor().defined()) {
        out.push_back(v.toTensor());
      }
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) {
        if (t.defined()) {
          out.push_back(t);
        }
      }
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef()) {
        collect_tensors(e, out);
      }
    } else if (v.isTuple()) {
      for (const c10::IValue& e : v.toTupleRef().elements()) {
        collect_tensors(e, out);
      }
    }
  }

  static bool first_tensor(const c10::IValue& v, OpRecord& rec) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        return false;
      }
      rec.device = t.device().type();
      rec.dtype = t.scalar_type();
      rec.has_device = true;
      return true;
    }
    if (!v.isTensorList() && !v.isList() && !v.isTuple()) {
      return false;
    }
    c10::SmallVector<at::Tensor, 4> ts;
    collect_tensors(v, ts);
    if (ts.empty()) {
      return false;
    }
    rec.device = ts[0].device().type();
    rec.dtype = ts[0].scalar_type();
    rec.has_device = true;
    return true;
  }

  static constexpr int kRead = 0;
  static constexpr int kUnreadIfTainted = 1;
  static constexpr int kWritten = 2;

  // Appends v's slot (a list's, then its items') to slots_.
  void add_slot(const c10::IValue& v, int64_t index, int mode) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      Slot s;
      if (!t.defined()) {
        s.kind = Slot::NoTensor;
      } else {
        s.kind = Slot::Tensor;
        const int64_t taint = mode != kRead ? taint_of(t) : -1;
        if (taint >= 0) {
          if (mode == kUnreadIfTainted && slot_taint_ < 0) {
            slot_taint_ = taint;
          }
          s.ref = shape_key(t, KeyKind::Uninitialized);
        } else if (mode == kWritten) {
          s.ref = shape_key(t, KeyKind::Unread);
        } else {
          s.ref = input_key(t, index);
        }
      }
      slots_.push_back(s);
      return;
    }
    if (v.isGenerator()) {
      add_generator_slot(v);
      return;
    }
    if (v.isTensorList() || v.isList() || v.isTuple()) {
      const size_t at = slots_.size();
      slots_.emplace_back().kind = Slot::List;
      if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorVector()) {
          add_slot(c10::IValue(t), index, mode);
        }
      } else if (v.isList()) {
        for (const c10::IValue& e : v.toListRef()) {
          add_slot(e, index, mode);
        }
      } else {
        for (const c10::IValue& e : v.toTupleRef().elements()) {
          add_slot(e, index, mode);
        }
      }
      slots_[at].span = static_cast<uint32_t>(slots_.size() - at - 1);
      return;
    }
    Slot s;
    s.kind = Slot::Value;
    s.ref = static_cast<int64_t>(values_.size());
    values_.push_back(v);
    slots_.push_back(s);
  }

  // A random op that is passed no generator draws from the default one of its device:
  // that generator's state at call time is one more input (another thread drawing
  // from it between runs makes the inputs differ, never the op nondeterministic).
  void add_default_generator(c10::ArrayRef<c10::IValue> inputs) {
    c10::DeviceType device = c10::DeviceType::CPU;
    bool found = false;
    for (const auto& v : inputs) {
      if (v.isGenerator()) {
        return;  // an explicit generator is keyed where it is passed
      }
      if (!found && v.isTensor() && v.toTensor().defined()) {
        device = v.toTensor().device().type();
        found = true;
      } else if (!found && v.isDevice()) {
        device = v.toDevice().type();
        found = true;
      }
    }
    try {
      at::Generator gen = at::globalContext().defaultGenerator(c10::Device(device));
      add_generator_slot(c10::IValue(gen));
    } catch (const std::exception&) {
      Slot s;
      s.kind = Slot::Value;
      s.ref = static_cast<int64_t>(values_.size());
      values_.emplace_back(std::string("default generator"));
      slots_.push_back(s);
    }
  }

  // A generator is keyed by its state at call time, as ("generator", device, digest).
  void add_generator_slot(const c10::IValue& v) {
    at::Tensor state;
    try {
      at::Generator gen = v.toGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      state = gen.get_state();
      const size_t at = slots_.size();
      slots_.emplace_back().kind = Slot::List;
      for (const char* word : {"generator", ""}) {
        Slot s;
        s.kind = Slot::Value;
        s.ref = static_cast<int64_t>(values_.size());
        values_.emplace_back(*word ? std::string(word)
                                   : std::string(c10::DeviceTypeName(gen.device().type(), true)));
        slots_.push_back(s);
      }
      Slot s;
      s.kind = Slot::Tensor;
      s.ref = digest(state, false);
      slots_.push_back(s);
      slots_[at].span = static_cast<uint32_t>(slots_.size() - at - 1);
    } catch (const std::exception&) {
      Slot s;
      s.kind = Slot::Value;
      s.ref = static_cast<int64_t>(values_.size());
      values_.push_back(v);
      slots_.push_back(s);
    }
  }

  int64_t input_key(const at::Tensor& t, int64_t index) {
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    const bool versioned = !impl->is_inference();
    auto it = known_.find(impl);
    const bool outside = !shared_.empty() && shared_.count(data_of(t)) > 0;
    if (versioned && it != known_.end() && !it->second.weak.expired() &&
        it->second.version == static_cast<int64_t>(impl->version_counter().current_version()) &&
        !outside) {
      return it->second.key;
    }
    // From outside the run, or changed since: digested at this first use unless the
    // previous run's key is proven still true. Memory shared with something outside
    // torch (NumPy) is read again at every use, since a write there moves no version
    // counter.
    first_uses_.emplace_back(index, impl);
    first_use_refs_.emplace_back(t.getIntrusivePtr());
    int64_t key = versioned && !outside && !carried_.empty() ? carried_key(t, impl) : -1;
    if (key < 0) {
      key = digest(t, true);
    }
    remember(t, key);
    if ((outside || !shared_.empty()) && shared_.count(data_of(t)) > 0 &&
        (outside_.empty() || outside_.back() != index)) {
      outside_.push_back(index);
    }
    return key;
  }

  void remember(const at::Tensor& t, int64_t key) {
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (impl->is_inference()) {
      return;  // no version counter: digested at every use
    }
    put_known(impl, Known{c10::weak_intrusive_ptr<c10::TensorImpl>::reclaim_copy(impl),
                          static_cast<int64_t>(impl->version_counter().current_version()), key});
    if (known_.size() > prune_at_) {
      for (auto it = known_.begin(); it != known_.end();) {
        it = it->second.weak.expired() ? known_.erase(it) : std::next(it);
      }
      prune_at_ = std::max<size_t>(2 * known_.size(), kPruneAt);
    }
  }

  void put_known(c10::TensorImpl* impl, Known entry) {
    auto it = known_.find(impl);
    if (it != known_.end()) {
      it->second = std::move(entry);
    } else {
      known_.emplace(impl, std::move(entry));
    }
  }

  int64_t add_key(const Key& k) {
    keys_.push_back(k);
    return static_cast<int64_t>(keys_.size()) - 1;
  }

  int64_t shape_key(const at::Tensor& t, KeyKind kind, const char* reason = "") {
    Key k;
    k.kind = kind;
    k.dtype = t.scalar_type();
    k.ref = static_cast<int64_t>(shapes_.size());
    ShapeInfo& info = shapes_.emplace_back();
    info.reason = reason;
    if (const auto* nested = at::native::get_nested_tensor_impl_or_null(t)) {
      // No sizes() to read (it throws): the components' sizes stand for the shape.
      const at::Tensor sizes = nested->get_nested_sizes().contiguous();
      info.nested_dim = sizes.dim() == 2 ? sizes.size(1) : 0;
      info.shape.assign(sizes.data_ptr<int64_t>(), sizes.data_ptr<int64_t>() + sizes.numel());
    } else {
      info.shape.assign(t.sizes().begin(), t.sizes().end());
    }
    return add_key(k);
  }

  int64_t digest(const at::Tensor& t, bool external) {
    if (!readable(t)) {
      return shape_key(t, KeyKind::Opaque, unreadable_reason(t));
    }
    if (t.numel() == 0) {
      return shape_key(t, KeyKind::Empty);
    }
    Key k;
    k.external = external;
    if (external) {
      k.storage = storage_of(t);
      // Memory torch did not allocate (torch.from_numpy, frombuffer, DLPack) cannot be
      // resized by torch: it is shared with its owner, who may write it at any time.
      // Memory shared with other processes (share_memory_) may be written by them.
      if (k.storage != nullptr && (!k.storage->resizable() || process_shared(k.storage))) {
        const void* data = data_of(t);
        if (data != nullptr) {
          shared_.insert(data);
        }
      }
    }
    const bool cpu = t.device().is_cpu();
    const int64_t span = covered_span(t);
    const bool overlapping = span < t.numel();
    // Only a digest that calls ops (a layout to resolve, a device kernel) needs them
    // kept from Python modes and autograd; most CPU outputs call none.
    std::optional<c10::impl::ExcludeDispatchKeyGuard> no_python;
    std::optional<at::AutoDispatchBelowADInplaceOrView> no_autograd;
    if (!cpu || !t.is_contiguous() || t.is_conj() || t.is_neg()) {
      no_python.emplace(
          c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
      no_autograd.emplace();
    }
    try {
      at::Tensor view = t;
      if (overlapping) {
        // An expanded (stride-0) or otherwise overlapping view: digested by the memory
        // it covers, its sizes and strides mixed in, never materialised.
        view = t.as_strided({span}, {1}, t.storage_offset());
        uint64_t extra = kSeed1;
        for (int64_t d : t.sizes()) {
          extra = chain(extra, static_cast<uint64_t>(d));
        }
        for (int64_t d : t.strides()) {
          extra = chain(extra, static_cast<uint64_t>(d) + 0x9e37U);
        }
        k.extra = extra | 1;
      }
      if (cpu) {
        uint64_t d[2];
        digest_host(view, d);
        k.kind = KeyKind::Digest;
        k.h0 = k.extra ? chain(d[0], k.extra) : d[0];
        k.h1 = k.extra ? chain(d[1], k.extra) : d[1];
      } else {
        static const auto op = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("pytest_backends::digest", "")
                                   .typed<at::Tensor(const at::Tensor&)>();
        k.kind = KeyKind::Pending;
        k.ref = static_cast<int64_t>(pending_.size());
        pending_.push_back(op.call(view));
      }
    } catch (const c10::Error&) {
      return shape_key(t, KeyKind::Opaque, "unreadable");
    }
    return add_key(k);
  }

  int64_t uninitialized(const at::Tensor& t, const OpInfo& info, const std::string& where) {
    if (t.numel() > 0) {
      const c10::StorageImpl* storage = storage_of(t);
      if (storage != nullptr) {
        std::string origin = info.name + where;
        tainted_.insert_or_assign(
            storage, std::make_pair(t.storage().getWeakStorageImpl(),
                                    static_cast<int64_t>(origins_.size())));
        origins_.push_back(std::move(origin));
      }
    }
    return shape_key(t, KeyKind::Uninitialized);
  }

  // " (test_x.py:12)": where the Python caller is, from the locator (with the GIL).
  std::string where() {
    if (!locator_ || locator_.is_none()) {
      return "";
    }
    py::gil_scoped_acquire gil;
    try {
      return py::cast<std::string>(locator_());
    } catch (const std::exception&) {
      return "";
    }
  }

  int64_t taint_of(const at::Tensor& t) {
    if (tainted_.empty() || t.numel() == 0) {
      return -1;
    }
    const c10::StorageImpl* storage = storage_of(t);
    auto it = tainted_.find(storage);
    if (it == tainted_.end()) {
      return -1;
    }
    if (it->second.first.expired()) {
      tainted_.erase(it);
      return -1;
    }
    return it->second.second;
  }

  int64_t reads_taint(const OpInfo& info, c10::ArrayRef<c10::IValue> inputs) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const int pos = static_cast<int>(i);
      if (std::find(info.outs.begin(), info.outs.end(), pos) != info.outs.end()) {
        continue;
      }
      if (info.overwrites &&
          std::find(info.written.begin(), info.written.end(), pos) != info.written.end()) {
        continue;
      }
      std::vector<at::Tensor> ts;
      collect_tensors(inputs[i], ts);
      for (const auto& t : ts) {
        const int64_t origin = taint_of(t);
        if (origin >= 0) {
          return origin;
        }
      }
    }
    return -1;
  }

  template <typename Tensors>
  void clear_taint(const Tensors& written) {
    for (const auto& t : written) {
      const c10::StorageImpl* storage = storage_of(t);
      if (storage != nullptr && t.is_contiguous() &&
          static_cast<size_t>(t.numel() * static_cast<int64_t>(t.element_size())) ==
              storage->nbytes()) {
        tainted_.erase(storage);
      }
    }
  }

  void resolve_pending() {
    if (pending_.empty()) {
      return;
    }
    c10::impl::ExcludeDispatchKeyGuard no_python(c10::DispatchKeySet(
        {c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot, kHookKey}));
    at::AutoDispatchBelowADInplaceOrView no_autograd;
    std::vector<std::pair<uint64_t, uint64_t>> values(pending_.size());
    std::unordered_map<std::string, std::vector<size_t>> by_device;
    for (size_t i = 0; i < pending_.size(); ++i) {
      by_device[pending_[i].device().str()].push_back(i);
    }
    for (const auto& group : by_device) {
      std::vector<at::Tensor> parts;
      for (size_t i : group.second) {
        parts.push_back(pending_[i]);
      }
      const at::Tensor host = at::stack(parts).cpu().contiguous();
      const auto* p = host.data_ptr<int64_t>();
      for (size_t n = 0; n < group.second.size(); ++n) {
        values[group.second[n]] = {static_cast<uint64_t>(p[2 * n]),
                                   static_cast<uint64_t>(p[2 * n + 1])};
      }
    }
    for (auto& k : keys_) {
      if (k.kind == KeyKind::Pending) {
        k.kind = KeyKind::Digest;
        k.h0 = values[static_cast<size_t>(k.ref)].first;
        k.h1 = values[static_cast<size_t>(k.ref)].second;
        if (k.extra) {
          k.h0 = chain(k.h0, k.extra);
          k.h1 = chain(k.h1, k.extra);
        }
        k.ref = -1;
      }
    }
    pending_.clear();
  }

  // --- fingerprints: equal exactly when the Python rows would compare equal ------

  static uint64_t chain(uint64_t h, uint64_t v) { return mix0(h ^ (v * kKey0 + kSeed1)); }

  uint64_t key_hash(int64_t id, std::vector<uint64_t>& memo, std::vector<uint64_t>& input_memo) {
    uint64_t& slot = memo[static_cast<size_t>(id)];
    if (slot != 0) {
      return slot;
    }
    const Key& k = keys_[static_cast<size_t>(id)];
    uint64_t h = chain(kSeed1, static_cast<uint64_t>(k.kind) + 1);
    if (k.kind == KeyKind::Digest) {
      h = chain(chain(h, k.h0), k.h1);
    } else if (k.kind == KeyKind::Value) {
      h = chain(h, value_hash(values_[static_cast<size_t>(k.ref)]));
    } else if (k.kind == KeyKind::View) {
      h = chain(h, ops_[static_cast<size_t>(k.ref)].info->name_hash);
      h = chain(h, static_cast<uint64_t>(k.index));
      h = chain(h, inputs_hash(k.ref, memo, input_memo));
    } else {
      const ShapeInfo& info = shapes_[static_cast<size_t>(k.ref)];
      h = chain(h, static_cast<uint64_t>(k.dtype));
      h = chain(h, info.shape.size());
      h = chain(h, static_cast<uint64_t>(info.nested_dim));
      for (int64_t d : info.shape) {
        h = chain(h, static_cast<uint64_t>(d));
      }
      h = chain(h, std::hash<std::string>{}(info.reason));
    }
    slot = h | 1;  // never 0, the "not computed" mark
    return slot;
  }

  uint64_t inputs_hash(int64_t op, std::vector<uint64_t>& memo, std::vector<uint64_t>& input_memo) {
    uint64_t& slot = input_memo[static_cast<size_t>(op)];
    if (slot != 0) {
      return slot;
    }
    uint64_t h = kSeed0;
    const OpRecord& r = ops_[static_cast<size_t>(op)];
    for (uint32_t i = r.inputs_begin; i < r.inputs_end; i += slots_[i].span + 1) {
      h = chain(h, slot_hash(i, memo, input_memo));
    }
    slot = h | 1;
    return slot;
  }

  uint64_t slot_hash(uint32_t at, std::vector<uint64_t>& memo, std::vector<uint64_t>& input_memo) {
    const Slot& s = slots_[at];
    switch (s.kind) {
      case Slot::Tensor:
        return chain(1, key_hash(s.ref, memo, input_memo));
      case Slot::NoTensor:
        return 2;
      case Slot::List: {
        uint64_t h = chain(3, s.span);
        for (uint32_t i = at + 1; i <= at + s.span; i += slots_[i].span + 1) {
          h = chain(h, slot_hash(i, memo, input_memo));
        }
        return h;
      }
      default:
        return chain(4, value_hash(values_[static_cast<size_t>(s.ref)]));
    }
  }

  static uint64_t bits(double d) {
    uint64_t b;
    std::memcpy(&b, &d, sizeof b);
    return b;
  }

  static uint64_t value_hash(const c10::IValue& v) {
    if (v.isNone()) {
      return 11;
    }
    if (v.isBool()) {
      return chain(12, v.toBool() ? 1 : 0);
    }
    if (v.isInt()) {
      return chain(13, static_cast<uint64_t>(v.toInt()));
    }
    if (v.isDouble()) {
      return chain(14, bits(v.toDouble()));
    }
    if (v.isString()) {
      return chain(15, std::hash<std::string>{}(v.toStringRef()));
    }
    if (v.isDevice()) {
      return chain(16, std::hash<std::string>{}(v.toDevice().str()));
    }
    if (v.isComplexDouble()) {
      const auto c = v.toComplexDouble();
      return chain(chain(17, bits(c.real())), bits(c.imag()));
    }
    if (v.isSymInt() && !v.toSymInt().is_heap_allocated()) {
      return chain(13, static_cast<uint64_t>(v.toSymInt().as_int_unchecked()));
    }
    return chain(18, std::hash<std::string>{}(v.tagKind()));
  }

  // --- to Python ---------------------------------------------------------------

  static py::object dtype_object(at::ScalarType t) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(t)));
  }

  py::tuple shape_of(const Key& k) const {
    const ShapeInfo& info = shapes_[static_cast<size_t>(k.ref)];
    const auto& shape = info.shape;
    if (info.nested_dim > 0) {  // a nested tensor: one tuple per component
      const size_t dim = static_cast<size_t>(info.nested_dim);
      py::tuple out(shape.size() / dim);
      for (size_t c = 0; c < out.size(); ++c) {
        py::tuple row(dim);
        for (size_t i = 0; i < dim; ++i) {
          row[i] = py::int_(shape[c * dim + i]);
        }
        out[c] = row;
      }
      return out;
    }
    py::tuple out(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) {
      out[i] = py::int_(shape[i]);
    }
    return out;
  }

  py::object key_object(int64_t id, std::vector<py::object>& memo,
                        std::vector<py::object>& input_memo) {
    py::object& slot = memo[static_cast<size_t>(id)];
    if (slot) {
      return slot;
    }
    const Key& k = keys_[static_cast<size_t>(id)];
    switch (k.kind) {
      case KeyKind::Digest:
        slot = py::make_tuple("digest", py::int_(k.h0), py::int_(k.h1));
        break;
      case KeyKind::View:
        slot = py::make_tuple("view", ops_[static_cast<size_t>(k.ref)].info->name, k.index,
                              op_inputs(k.ref, memo, input_memo));
        break;
      case KeyKind::Uninitialized:
        slot = py::make_tuple("uninitialized", dtype_object(k.dtype), shape_of(k));
        break;
      case KeyKind::Workspace:
        slot = py::make_tuple("workspace", dtype_object(k.dtype), shape_of(k));
        break;
      case KeyKind::Empty:
        slot = py::make_tuple("empty", dtype_object(k.dtype), shape_of(k));
        break;
      case KeyKind::Unread:
        slot = py::make_tuple("unread", dtype_object(k.dtype), shape_of(k));
        break;
      case KeyKind::Rebound:
        slot = py::make_tuple("rebound", dtype_object(k.dtype), shape_of(k));
        break;
      case KeyKind::Value:
        slot = value_object(values_[static_cast<size_t>(k.ref)]);
        break;
      default:
        slot = py::make_tuple("opaque", dtype_object(k.dtype), shape_of(k),
                              shapes_[static_cast<size_t>(k.ref)].reason);
        break;
    }
    return slot;
  }

  py::object op_inputs(int64_t op, std::vector<py::object>& memo,
                       std::vector<py::object>& input_memo) {
    py::object& slot = input_memo[static_cast<size_t>(op)];
    if (slot) {
      return slot;
    }
    const OpRecord& r = ops_[static_cast<size_t>(op)];
    slot = items_object(r.inputs_begin, r.inputs_end, memo, input_memo);
    return slot;
  }

  // The slots in [begin, end) that are not items of another, as a tuple.
  py::tuple items_object(uint32_t begin, uint32_t end, std::vector<py::object>& memo,
                         std::vector<py::object>& input_memo) {
    size_t n = 0;
    for (uint32_t i = begin; i < end; i += slots_[i].span + 1) {
      ++n;
    }
    py::tuple out(n);
    n = 0;
    for (uint32_t i = begin; i < end; i += slots_[i].span + 1) {
      out[n++] = slot_object(i, memo, input_memo);
    }
    return out;
  }

  py::object slot_object(uint32_t at, std::vector<py::object>& memo,
                         std::vector<py::object>& input_memo) {
    const Slot& s = slots_[at];
    switch (s.kind) {
      case Slot::Tensor:
        return key_object(s.ref, memo, input_memo);
      case Slot::NoTensor:
        return py::none();
      case Slot::List:
        return items_object(at + 1, at + 1 + s.span, memo, input_memo);
      default:
        return value_object(values_[static_cast<size_t>(s.ref)]);
    }
  }

  // Plain values as recorder.py keys them: floats by their exact hex form.
  static py::object value_object(const c10::IValue& v) {
    if (v.isNone()) {
      return py::none();
    }
    if (v.isBool()) {
      return py::bool_(v.toBool());
    }
    if (v.isInt()) {
      return py::int_(v.toInt());
    }
    if (v.isDouble()) {
      return py::float_(v.toDouble()).attr("hex")();
    }
    if (v.isString()) {
      return py::str(v.toStringRef());
    }
    if (v.isDevice()) {
      return py::str(v.toDevice().str());
    }
    if (v.isComplexDouble()) {
      const auto c = v.toComplexDouble();
      return py::make_tuple("complex", py::float_(c.real()).attr("hex")(),
                            py::float_(c.imag()).attr("hex")());
    }
    if (v.isSymInt()) {
      const auto s = v.toSymInt();
      if (s.is_heap_allocated()) {
        return py::make_tuple("object", "SymInt");
      }
      return py::int_(s.as_int_unchecked());
    }
    return py::make_tuple("object", v.tagKind());
  }

  SpinLock mutex_;
  // Data pointers of storages shared with something outside torch (NumPy views made by
  // Tensor.numpy(), memory torch did not allocate), and the ops that read one.
  std::unordered_set<const void*> shared_;
  std::vector<int64_t> outside_;
  std::vector<std::pair<int64_t, std::string>> outside_places_;
  bool hooked_ = false;  // the key is in the included set of thread_
  bool was_excluded_ = true;
  std::thread::id thread_;
  bool finished_ = false;
  bool broken_ = false;
  std::string failure_;
  std::string blind_;
  int64_t slot_taint_ = -1;  // begin_op: the taint an overwrite's source carries
  py::object locator_;
  py::object observer_;
  std::vector<OpRecord> ops_;
  std::vector<Key> keys_;
  std::vector<Slot> slots_;
  std::vector<int64_t> outputs_;
  std::vector<c10::IValue> values_;  // plain inputs and non-tensor results
  std::vector<ShapeInfo> shapes_;
  std::vector<at::Tensor> pending_;
  // Open addressing: no allocation per remembered tensor.
  ska::flat_hash_map<c10::TensorImpl*, Known> known_;
  // Keys carried from the previous run, and those this run leaves to the next one.
  ska::flat_hash_map<c10::TensorImpl*, Carried> carried_;
  ska::flat_hash_map<c10::TensorImpl*, Carried> carry_out_;
  // Storages a recorded op of this run wrote (its mutable arguments).
  std::unordered_set<const c10::StorageImpl*> written_;
  std::unordered_map<const c10::StorageImpl*,
                     std::pair<c10::weak_intrusive_ptr<c10::StorageImpl>, int64_t>>
      tainted_;
  std::vector<std::string> origins_;
  std::vector<std::pair<int64_t, c10::TensorImpl*>> first_uses_;
  // Keep first-use tensors' addresses from being reused while the record lives.
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> first_use_refs_;
  size_t prune_at_ = kPruneAt;
};

bool any_wrapper(c10::ArrayRef<c10::IValue> values) {
  for (const auto& v : values) {
    if (wrapper(v)) {
      return true;
    }
  }
  return false;
}

void record_op(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto below = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kHookKey);
  Recorder* self = g_active;
  if (self == nullptr || t_inside > 0) {
    op.redispatchBoxed(below, stack);
    return;
  }
  const OpInfo& info = info_of(op);
  if (info.marker) {
    op.redispatchBoxed(below, stack);  // a range marker reads and writes no data
    return;
  }
  const size_t num_inputs = op.schema().arguments().size();
  TORCH_INTERNAL_ASSERT(stack->size() >= num_inputs);
  const c10::ArrayRef<c10::IValue> inputs(stack->data() + stack->size() - num_inputs, num_inputs);
  if (info.composite || compiling() || any_wrapper(inputs)) {
    if (!info.composite && !compiling()) {
      for (const auto& v : inputs) {
        if (python_wrapper(v)) {
          // Its __torch_dispatch__ runs with this hook excluded: its ops go unseen.
          try {
            self->note_blind(inputs);
          } catch (const std::exception& e) {
            self->fail(e.what());
          }
          break;
        }
      }
    }
    op.redispatchBoxed(below, stack);  // looked through: the ops it calls come back here
    return;
  }
  c10::impl::ExcludeDispatchKeyGuard nested(kHookKey);
  ++t_inside;
  OpContext ctx;
  try {
    self->begin_op(info, inputs, ctx);
  } catch (const std::exception& e) {
    self->fail(e.what());
    ctx.index = -1;
  }
  // Ends the op for a recorder still active, or at least gives back the warning handler.
  auto end = [&](c10::ArrayRef<c10::IValue> outputs, bool raised) {
    if (g_active == self) {
      self->after_op(info, ctx, outputs, raised);
    } else if (ctx.alerts) {
      c10::WarningUtils::set_warning_handler(ctx.alerts->previous_);
    }
    --t_inside;
  };
  try {
    op.redispatchBoxed(below, stack);
  } catch (...) {
    end({}, /*raised=*/true);
    throw;
  }
  const size_t num_outputs = op.schema().returns().size();
  TORCH_INTERNAL_ASSERT(stack->size() >= num_outputs);
  end(c10::ArrayRef<c10::IValue>(stack->data() + stack->size() - num_outputs, num_outputs),
      /*raised=*/false);
}


void set_op_tables(const std::vector<std::string>& uninitialized,
                   const std::vector<std::string>& overwrites,
                   const std::vector<std::string>& rebinds,
                   const std::unordered_map<std::string, std::vector<int>>& workspaces,
                   const std::vector<std::string>& marker_namespaces) {
  std::lock_guard<std::mutex> lock(g_info_mutex);
  OpTables next;
  next.uninitialized.insert(uninitialized.begin(), uninitialized.end());
  next.overwrites.insert(overwrites.begin(), overwrites.end());
  next.rebinds.insert(rebinds.begin(), rebinds.end());
  next.marker_namespaces.insert(marker_namespaces.begin(), marker_namespaces.end());
  for (const auto& entry : workspaces) {
    std::vector<int> positions = entry.second;
    std::sort(positions.begin(), positions.end());
    next.workspaces[entry.first] = positions;
  }
  next.set = true;
  OpTables& tables = op_tables();
  const bool same = tables.set && tables.uninitialized == next.uninitialized &&
                    tables.overwrites == next.overwrites && tables.rebinds == next.rebinds &&
                    tables.workspaces == next.workspaces &&
                    tables.marker_namespaces == next.marker_namespaces;
  if (same) {
    return;
  }
  // Ops already seen keep the flags they were given: changing the tables then would
  // make one process record the same op two ways.
  TORCH_CHECK(g_infos.empty(), "the native op recorder's op tables are set once, before recording");
  tables = std::move(next);
}

py::tuple get_op_tables() {
  std::lock_guard<std::mutex> lock(g_info_mutex);
  const OpTables& tables = op_tables();
  py::dict workspaces;
  for (const auto& entry : tables.workspaces) {
    workspaces[py::str(entry.first)] = py::cast(entry.second);
  }
  auto names = [](const std::unordered_set<std::string>& set) {
    std::vector<std::string> out(set.begin(), set.end());
    std::sort(out.begin(), out.end());
    return out;
  };
  return py::make_tuple(names(tables.uninitialized), names(tables.overwrites),
                        names(tables.rebinds), workspaces, names(tables.marker_namespaces));
}

}  // namespace

void register_recorder(py::module_& m) {
  py::class_<Recorder>(m, "RunRecorder",
                       "Records the ops of one run at the dispatcher (see recorder.cpp).")
      .def(py::init([](const Recorder* previous, bool carry) {
             return new Recorder(previous, carry);
           }),
           py::arg("previous") = nullptr, py::arg("carry") = true)
      .def("start", &Recorder::start, "Start recording on this thread.")
      .def("stop", &Recorder::stop, "Stop recording.")
      .def("set_locator", &Recorder::set_locator,
           "A callable giving ' (file:line)' of the Python caller, for uninitialised memory.")
      .def("set_observer", &Recorder::set_observer,
           "A callable called as observer(index, name) after each recorded op (with the GIL).")
      .def("finish", &Recorder::finish,
           "Stop; return (fingerprint, census keys, first uses, failure).")
      .def("rows", &Recorder::rows, "The record as rows of OpCall fields (after finish).")
      .def("blind", &Recorder::blind,
           "The type of the first __torch_dispatch__ wrapper whose ops ran unseen, or None.")
      .def("add_shared", &Recorder::add_shared, py::arg("data_ptr"),
           "Note a storage (its data pointer) as shared with something outside torch.")
      .def("outside", &Recorder::outside,
           "Indices of the ops that read memory shared outside torch.")
      .def("outside_places", &Recorder::outside_places,
           "(op index, ' (file:line)') of the ops that read memory shared outside torch.")
      .def("note_alert", &Recorder::note_alert,
           "Mark the last op that raised as a determinism alert.");
  m.def("set_op_tables", &set_op_tables, py::arg("uninitialized"), py::arg("overwrites"),
        py::arg("rebinds"), py::arg("workspaces"), py::arg("marker_namespaces"),
        "Set the recorder's op tables (once, before recording; from op_tables.py).");
  m.def("op_tables", &get_op_tables,
        "The recorder's op tables: (uninitialized, overwrites, rebinds, workspaces, "
        "marker_namespaces).");
  m.def(
      "recorder_hook_error", [] { return hook_error(); },
      "Why the native recorder cannot hook the dispatcher here, or '' when it can.");
}

}  // namespace pytest_backends
