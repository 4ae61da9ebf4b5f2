#include "h5/h5.h"

#define OMPI_SKIP_MPICXX 1  // the C API only
#define MPICH_SKIP_MPICXX 1
#include <hdf5.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "core/error.h"

#ifndef H5_HAVE_PARALLEL
#error "ucp needs the parallel HDF5 build (Debian: libhdf5-openmpi-dev)"
#endif

namespace ucp::h5 {
namespace {

// HDF5 without thread safety: one call at a time in the whole process. Recursive, so that a checked
// call can walk the error stack while it holds the lock.
std::recursive_mutex& Mutex() {
  static std::recursive_mutex mu;
  return mu;
}

void InitOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5open();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors are ours to report
  });
}

// HDF5's error stack, innermost last, as one line; clears it.
std::string ErrorStack() {
  std::string out;
  auto walk = [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
    auto& s = *static_cast<std::string*>(data);
    char minor[256] = "";
    H5Eget_msg(e->min_num, nullptr, minor, sizeof minor);
    if (!s.empty()) s += "; ";
    s += std::string(e->func_name ? e->func_name : "?") + "(): " + (e->desc ? e->desc : "");
    if (minor[0]) s += " (" + std::string(minor) + ")";
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk, &out);
  H5Eclear2(H5E_DEFAULT);
  for (char& c : out)
    if (c == '\n') c = ' ';  // HDF5's messages embed ctime() and its newline
  return out.empty() ? "no HDF5 error message" : out;
}

// HDF5's error stack does not carry errno: a write or close that failed on a full file system
// says only "write failed". When the file's file system has (almost) no room left, say so.
std::string SpaceNote(const std::string& file) {
  struct statvfs st {};
  const size_t slash = file.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : file.substr(0, slash);
  if (::statvfs(dir.c_str(), &st) != 0) return "";
  const unsigned long long free = static_cast<unsigned long long>(st.f_bavail) * st.f_frsize;
  if (free >= (1u << 20)) return "";
  return " (No space left on device: " + std::to_string(free) + " bytes free on the file system of " + dir + ")";
}

// Runs one HDF5 call under the lock; a negative result becomes ucp::Error("where: op: stack").
template <typename Fn>
auto Call(const char* op, const std::string& where, Fn&& fn) {
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  InitOnce();
  auto r = fn();
  if (r < 0) throw Error(where + ": " + op + ": " + ErrorStack());
  return r;
}

herr_t CloseId(hid_t id, Object::Type type) {
  switch (type) {
    case Object::Type::File: return H5Fclose(id);
    case Object::Type::Group: return H5Gclose(id);
    case Object::Type::Dataset: return H5Dclose(id);
    case Object::Type::Dataspace: return H5Sclose(id);
    case Object::Type::Attribute: return H5Aclose(id);
    case Object::Type::PropList: return H5Pclose(id);
    case Object::Type::Datatype: return H5Tclose(id);
    case Object::Type::None: return 0;
  }
  return 0;
}

std::string Join(const std::string& path, const std::string& name) { return path == "/" ? "/" + name : path + "/" + name; }

std::vector<hsize_t> Dims(const std::vector<int64_t>& shape) { return {shape.begin(), shape.end()}; }

// Fixed-length UTF-8 strings, NUL-padded, of `size` bytes (at least 1). Not variable-length ones:
// those live in the file's global heap, and HDF5 1.10 trusts a damaged heap's lengths (a memcpy of
// any size), while a fixed-length string is read from the attribute's own message, bounded.
hid_t FixedString(const std::string& where, size_t size) {
  hid_t t = Call("H5Tcopy", where, [] { return H5Tcopy(H5T_C_S1); });
  Call("H5Tset_size", where, [&] { return H5Tset_size(t, std::max<size_t>(size, 1)); });
  Call("H5Tset_strpad", where, [&] { return H5Tset_strpad(t, H5T_STR_NULLPAD); });
  Call("H5Tset_cset", where, [&] { return H5Tset_cset(t, H5T_CSET_UTF8); });
  return t;
}

}  // namespace

Object::Object(int64_t id, Type type, std::shared_ptr<const std::string> file, std::string path)
    : id_(id), type_(type), file_(file ? std::move(file) : std::make_shared<const std::string>()), path_(std::move(path)) {}

Object::~Object() {
  if (id_ < 0) return;
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  if (CloseId(id_, type_) < 0) H5Eclear2(H5E_DEFAULT);  // nothing to report to in a destructor
}

Object::Object(Object&& o) noexcept : id_(o.id_), type_(o.type_), file_(std::move(o.file_)), path_(std::move(o.path_)) {
  o.id_ = -1;
  o.file_ = std::make_shared<std::string>();
}

Object& Object::operator=(Object&& o) noexcept {
  if (this != &o) {
    Object old(std::move(*this));
    id_ = o.id_, type_ = o.type_, file_ = std::move(o.file_), path_ = std::move(o.path_);
    o.id_ = -1;
    o.file_ = std::make_shared<std::string>();
  }
  return *this;
}

void Object::Close() {
  if (id_ < 0) return;
  hid_t id = id_;
  id_ = -1;
  const char* op = type_ == Type::File ? "H5Fclose" : type_ == Type::Dataset ? "H5Dclose" : "H5*close";
  try {
    Call(op, Where(), [&] { return CloseId(id, type_); });
  } catch (const Error& e) {
    throw Error(e.what() + (type_ == Type::File || type_ == Type::Dataset ? SpaceNote(*file_) : ""));
  }
}

std::string Object::Where() const { return *file_ + ": " + (path_.empty() ? "/" : path_); }

// ---------------------------------------------------------------------------------------------
// Attributes

namespace {

struct Attr {
  Object attr, space, type;
};

Object Space(const std::string& where, std::span<const hsize_t> dims) {
  hid_t s = dims.empty() ? Call("H5Screate", where, [] { return H5Screate(H5S_SCALAR); })
                         : Call("H5Screate_simple", where, [&] {
                             return H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
                           });
  return Object(s, Object::Type::Dataspace, nullptr, "");
}

}  // namespace

bool Object::HasAttribute(const std::string& name) const {
  return Call("H5Aexists", Where() + " attribute '" + name + "'", [&] { return H5Aexists(id_, name.c_str()); }) > 0;
}

namespace {

void WriteAttribute(hid_t id, const std::string& where, const std::string& name, hid_t file_type,
                    hid_t mem_type, std::span<const hsize_t> dims, const void* data) {
  const std::string w = where + " attribute '" + name + "'";
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  if (Call("H5Aexists", w, [&] { return H5Aexists(id, name.c_str()); }) > 0)
    Call("H5Adelete", w, [&] { return H5Adelete(id, name.c_str()); });
  Object space = Space(w, dims);
  hid_t a = Call("H5Acreate2", w, [&] { return H5Acreate2(id, name.c_str(), file_type, space.id(), H5P_DEFAULT, H5P_DEFAULT); });
  Object attr(a, Object::Type::Attribute, nullptr, "");
  Call("H5Awrite", w, [&] { return H5Awrite(a, mem_type, data); });
}

// Opens an attribute and checks its type class; `elements` receives its element count.
Object OpenAttribute(hid_t id, const std::string& w, const std::string& name, H5T_class_t want, Object* type,
                     hsize_t* elements) {
  hid_t a = Call("H5Aopen", w, [&] { return H5Aopen(id, name.c_str(), H5P_DEFAULT); });
  Object attr(a, Object::Type::Attribute, nullptr, "");
  *type = Object(Call("H5Aget_type", w, [&] { return H5Aget_type(a); }), Object::Type::Datatype, nullptr, "");
  H5T_class_t cls = Call("H5Tget_class", w, [&] { return H5Tget_class(type->id()); });
  if (cls != want) throw Error(w + ": has HDF5 type class " + std::to_string(static_cast<int>(cls)) + ", expected " +
                               (want == H5T_STRING ? "a string" : want == H5T_INTEGER ? "an integer" : "a float"));
  Object space(Call("H5Aget_space", w, [&] { return H5Aget_space(a); }), Object::Type::Dataspace, nullptr, "");
  hssize_t n = Call("H5Sget_simple_extent_npoints", w, [&] { return H5Sget_simple_extent_npoints(space.id()); });
  *elements = static_cast<hsize_t>(n);
  return attr;
}

}  // namespace

void Object::SetAttribute(const std::string& name, int64_t value) const {
  WriteAttribute(id_, Where(), name, H5T_STD_I64LE, H5T_NATIVE_INT64, {}, &value);
}

void Object::SetAttribute(const std::string& name, const std::string& value) const {
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  Object t(FixedString(Where(), value.size()), Type::Datatype, nullptr, "");
  std::string padded = value;
  padded.resize(std::max<size_t>(value.size(), 1), '\0');
  WriteAttribute(id_, Where(), name, t.id(), t.id(), {}, padded.data());
}

void Object::SetAttribute(const std::string& name, std::span<const int64_t> values) const {
  hsize_t n = values.size();
  int64_t dummy = 0;
  WriteAttribute(id_, Where(), name, H5T_STD_I64LE, H5T_NATIVE_INT64, {&n, 1},
                 values.empty() ? &dummy : values.data());
}

void Object::SetAttribute(const std::string& name, const std::vector<std::string>& values) const {
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  size_t size = 1;
  for (const auto& v : values) size = std::max(size, v.size());
  Object t(FixedString(Where(), size), Type::Datatype, nullptr, "");
  std::string packed(std::max<size_t>(values.size(), 1) * size, '\0');
  for (size_t k = 0; k < values.size(); ++k) packed.replace(k * size, values[k].size(), values[k]);
  hsize_t n = values.size();
  WriteAttribute(id_, Where(), name, t.id(), t.id(), {&n, 1}, packed.data());
}

void Object::SetScalarAttribute(const std::string& name, Numeric type, const void* value) const {
  hid_t ft = type == Numeric::F32 ? H5T_IEEE_F32LE : type == Numeric::F64 ? H5T_IEEE_F64LE : H5T_STD_I64LE;
  hid_t mt = type == Numeric::F32 ? H5T_NATIVE_FLOAT : type == Numeric::F64 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_INT64;
  WriteAttribute(id_, Where(), name, ft, mt, {}, value);
}

int64_t Object::IntAttribute(const std::string& name) const {
  auto v = IntsAttribute(name);
  if (v.size() != 1) throw Error(Where() + " attribute '" + name + "': holds " + std::to_string(v.size()) + " values, expected 1");
  return v[0];
}

std::vector<int64_t> Object::IntsAttribute(const std::string& name) const {
  const std::string w = Where() + " attribute '" + name + "'";
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  Object type;
  hsize_t n = 0;
  Object a = OpenAttribute(id_, w, name, H5T_INTEGER, &type, &n);
  if (n > (hsize_t{1} << 24)) throw Error(w + ": " + std::to_string(n) + " integers, more than ucp writes");
  std::vector<int64_t> out(n);
  if (n > 0) Call("H5Aread", w, [&] { return H5Aread(a.id(), H5T_NATIVE_INT64, out.data()); });
  return out;
}

std::string Object::StringAttribute(const std::string& name) const {
  auto v = StringsAttribute(name);
  if (v.size() != 1) throw Error(Where() + " attribute '" + name + "': holds " + std::to_string(v.size()) + " strings, expected 1");
  return v[0];
}

std::vector<std::string> Object::StringsAttribute(const std::string& name) const {
  const std::string w = Where() + " attribute '" + name + "'";
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  Object type;
  hsize_t n = 0;
  Object a = OpenAttribute(id_, w, name, H5T_STRING, &type, &n);
  if (Call("H5Tis_variable_str", w, [&] { return H5Tis_variable_str(type.id()); }) != 0)
    throw Error(w + ": a variable-length string; ucp writes and reads fixed-length ones");
  size_t size = H5Tget_size(type.id());
  if (size == 0 || size > (size_t{1} << 20)) throw Error(w + ": a string of " + std::to_string(size) + " bytes");
  if (n > (size_t{64} << 20) / size) throw Error(w + ": " + std::to_string(n) + " strings, more than ucp writes");
  Object mem(FixedString(w, size), Type::Datatype, nullptr, "");
  std::string packed(n * size, '\0');
  if (n > 0) Call("H5Aread", w, [&] { return H5Aread(a.id(), mem.id(), packed.data()); });
  std::vector<std::string> out;
  for (size_t k = 0; k < n; ++k) {
    std::string v = packed.substr(k * size, size);
    out.push_back(v.substr(0, v.find('\0')));
  }
  return out;
}

Object::Numeric Object::ScalarAttribute(const std::string& name, void* value8) const {
  const std::string w = Where() + " attribute '" + name + "'";
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  hid_t a = Call("H5Aopen", w, [&] { return H5Aopen(id_, name.c_str(), H5P_DEFAULT); });
  Object attr(a, Type::Attribute, nullptr, "");
  Object type(Call("H5Aget_type", w, [&] { return H5Aget_type(a); }), Type::Datatype, nullptr, "");
  Object space(Call("H5Aget_space", w, [&] { return H5Aget_space(a); }), Type::Dataspace, nullptr, "");
  if (Call("H5Sget_simple_extent_npoints", w, [&] { return H5Sget_simple_extent_npoints(space.id()); }) != 1)
    throw Error(w + ": not a scalar");
  H5T_class_t cls = Call("H5Tget_class", w, [&] { return H5Tget_class(type.id()); });
  size_t size = H5Tget_size(type.id());
  Numeric kind;
  hid_t mem;
  if (cls == H5T_FLOAT && size == 4) kind = Numeric::F32, mem = H5T_NATIVE_FLOAT;
  else if (cls == H5T_FLOAT && size == 8) kind = Numeric::F64, mem = H5T_NATIVE_DOUBLE;
  else if (cls == H5T_INTEGER) kind = Numeric::I64, mem = H5T_NATIVE_INT64;
  else throw Error(w + ": neither a float32, a float64 nor an integer");
  Call("H5Aread", w, [&] { return H5Aread(a, mem, value8); });
  return kind;
}

// ---------------------------------------------------------------------------------------------
// Groups and datasets

Group Group::CreateGroup(const std::string& name) const {
  std::string p = Join(path_, name);
  const std::string w = *file_ + ": " + p;
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  Object gcpl(Call("H5Pcreate", w, [] { return H5Pcreate(H5P_GROUP_CREATE); }), Type::PropList, nullptr, "");
  Call("H5Pset_obj_track_times", w, [&] { return H5Pset_obj_track_times(gcpl.id(), false); });  // same input, same bytes
  hid_t g = Call("H5Gcreate2", w, [&] { return H5Gcreate2(id_, name.c_str(), H5P_DEFAULT, gcpl.id(), H5P_DEFAULT); });
  return Group(g, Type::Group, file_, p);
}

Group Group::OpenGroup(const std::string& name) const {
  std::string p = Join(path_, name);
  if (!HasLink(name)) throw Error(*file_ + ": " + p + ": no such group");
  hid_t g = Call("H5Gopen2", *file_ + ": " + p, [&] { return H5Gopen2(id_, name.c_str(), H5P_DEFAULT); });
  return Group(g, Type::Group, file_, p);
}

bool Group::HasLink(const std::string& name) const {
  return Call("H5Lexists", *file_ + ": " + Join(path_, name), [&] { return H5Lexists(id_, name.c_str(), H5P_DEFAULT); }) > 0;
}

std::vector<std::string> Group::Members() const {
  std::vector<std::string> out;
  auto cb = [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
    static_cast<std::vector<std::string>*>(data)->emplace_back(name);
    return 0;
  };
  hsize_t idx = 0;
  Call("H5Literate", Where(), [&] { return H5Literate(id_, H5_INDEX_NAME, H5_ITER_INC, &idx, cb, &out); });
  return out;
}

Dataset Group::CreateFloatDataset(const std::string& name, const std::vector<int64_t>& shape,
                                  const std::vector<int64_t>& chunk) const {
  std::string p = Join(path_, name);
  std::string w = *file_ + ": " + p;
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  auto dims = Dims(shape);
  Object space = Space(w, dims);
  Object dcpl(Call("H5Pcreate", w, [] { return H5Pcreate(H5P_DATASET_CREATE); }), Type::PropList, nullptr, "");
  if (!chunk.empty()) {
    auto c = Dims(chunk);
    Call("H5Pset_chunk", w, [&] { return H5Pset_chunk(dcpl.id(), static_cast<int>(c.size()), c.data()); });
  }
  // Space at creation (what parallel HDF5 needs anyway) and no fill values: every byte is written once.
  Call("H5Pset_alloc_time", w, [&] { return H5Pset_alloc_time(dcpl.id(), H5D_ALLOC_TIME_EARLY); });
  Call("H5Pset_fill_time", w, [&] { return H5Pset_fill_time(dcpl.id(), H5D_FILL_TIME_NEVER); });
  Call("H5Pset_obj_track_times", w, [&] { return H5Pset_obj_track_times(dcpl.id(), false); });
  hid_t d = Call("H5Dcreate2", w, [&] {
    return H5Dcreate2(id_, name.c_str(), H5T_IEEE_F32LE, space.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT);
  });
  return Dataset(d, Type::Dataset, file_, p);
}

Dataset Group::OpenDataset(const std::string& name) const {
  std::string p = Join(path_, name);
  if (!HasLink(name)) throw Error(*file_ + ": " + p + ": no such dataset");
  hid_t d = Call("H5Dopen2", *file_ + ": " + p, [&] { return H5Dopen2(id_, name.c_str(), H5P_DEFAULT); });
  return Dataset(d, Type::Dataset, file_, p);
}

void Group::Unlink(const std::string& name) const {
  Call("H5Ldelete", *file_ + ": " + Join(path_, name), [&] { return H5Ldelete(id_, name.c_str(), H5P_DEFAULT); });
}

std::vector<int64_t> Dataset::Shape() const {
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  const std::string w = Where();
  Object space(Call("H5Dget_space", w, [&] { return H5Dget_space(id_); }), Type::Dataspace, nullptr, "");
  int rank = Call("H5Sget_simple_extent_ndims", w, [&] { return H5Sget_simple_extent_ndims(space.id()); });
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) Call("H5Sget_simple_extent_dims", w, [&] { return H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr); });
  return {dims.begin(), dims.end()};
}

bool Dataset::IsFloat32() const {
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  Object type(Call("H5Dget_type", Where(), [&] { return H5Dget_type(id_); }), Type::Datatype, nullptr, "");
  return Call("H5Tequal", Where(), [&] { return H5Tequal(type.id(), H5T_IEEE_F32LE); }) > 0;
}

std::vector<int64_t> Dataset::ChunkShape() const {
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  Object dcpl(Call("H5Dget_create_plist", Where(), [&] { return H5Dget_create_plist(id_); }), Type::PropList, nullptr, "");
  H5D_layout_t layout = Call("H5Pget_layout", Where(), [&] { return H5Pget_layout(dcpl.id()); });
  if (layout != H5D_CHUNKED) return {};
  hsize_t dims[H5S_MAX_RANK];
  int rank = Call("H5Pget_chunk", Where(), [&] { return H5Pget_chunk(dcpl.id(), H5S_MAX_RANK, dims); });
  return {dims, dims + rank};
}

void Dataset::WriteAll(const float* data) const {
  auto shape = Shape();
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (n == 0) return;
  try {
    Call("H5Dwrite", Where(), [&] { return H5Dwrite(id_, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data); });
  } catch (const Error& e) {
    throw Error(e.what() + SpaceNote(*file_));
  }
}

void Dataset::ReadSlab(std::span<const int64_t> start, std::span<const int64_t> count, float* dst) const {
  const std::string w = Where();
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  Object space(Call("H5Dget_space", w, [&] { return H5Dget_space(id_); }), Type::Dataspace, nullptr, "");
  int rank = Call("H5Sget_simple_extent_ndims", w, [&] { return H5Sget_simple_extent_ndims(space.id()); });
  if (static_cast<size_t>(rank) != start.size() || start.size() != count.size())
    throw Error(w + ": a slab of rank " + std::to_string(start.size()) + " of a dataset of rank " + std::to_string(rank));
  if (rank == 0) {
    Call("H5Dread", w, [&] { return H5Dread(id_, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst); });
    return;
  }
  std::vector<hsize_t> s(start.begin(), start.end()), c(count.begin(), count.end());
  for (hsize_t x : c)
    if (x == 0) return;
  Call("H5Sselect_hyperslab", w,
       [&] { return H5Sselect_hyperslab(space.id(), H5S_SELECT_SET, s.data(), nullptr, c.data(), nullptr); });
  Object mem = Space(w, c);
  Call("H5Dread", w, [&] { return H5Dread(id_, H5T_NATIVE_FLOAT, mem.id(), space.id(), H5P_DEFAULT, dst); });
}

// ---------------------------------------------------------------------------------------------
// Files

namespace {

Object AccessList(const std::string& path, const void* mpi_comm) {
  Object fapl(Call("H5Pcreate", path, [] { return H5Pcreate(H5P_FILE_ACCESS); }), Object::Type::PropList, nullptr, "");
  // The 1.8 file format: compact and indexed groups (a checkpoint has tens of thousands of
  // parameters), readable by every HDF5 tool since 1.8.
  Call("H5Pset_libver_bounds", path, [&] { return H5Pset_libver_bounds(fapl.id(), H5F_LIBVER_V18, H5F_LIBVER_V18); });
  if (mpi_comm) {
    MPI_Comm comm = *static_cast<const MPI_Comm*>(mpi_comm);
    Call("H5Pset_fapl_mpio", path, [&] { return H5Pset_fapl_mpio(fapl.id(), comm, MPI_INFO_NULL); });
  }
  return fapl;
}

}  // namespace

File File::Create(const std::string& path, const void* mpi_comm) {
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  Object fapl = AccessList(path, mpi_comm);
  Object fcpl(Call("H5Pcreate", path, [] { return H5Pcreate(H5P_FILE_CREATE); }), Object::Type::PropList, nullptr, "");
  Call("H5Pset_obj_track_times", path, [&] { return H5Pset_obj_track_times(fcpl.id(), false); });  // the root group's too
  hid_t f = Call("H5Fcreate", path, [&] { return H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.id(), fapl.id()); });
  File out;
  static_cast<Object&>(out) = Object(f, Type::File, std::make_shared<const std::string>(path), "/");
  return out;
}

File File::Open(const std::string& path, bool writable, const void* mpi_comm) {
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  Object fapl = AccessList(path, mpi_comm);
  hid_t f = Call("H5Fopen", path,
                 [&] { return H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl.id()); });
  File out;
  static_cast<Object&>(out) = Object(f, Type::File, std::make_shared<const std::string>(path), "/");
  return out;
}

int64_t File::Size() const {
  hsize_t size = 0;
  Call("H5Fget_filesize", Where(), [&] { return H5Fget_filesize(id_, &size); });
  return static_cast<int64_t>(size);
}

void File::Abandon() {
  id_ = -1;  // never closed: HDF5 keeps it until the process ends, and no exit hook closes it
}

void InitializeBeforeMpi() {
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  H5dont_atexit();
  InitOnce();
}

int64_t OpenIdCount() {
  std::lock_guard<std::recursive_mutex> lock(Mutex());
  InitOnce();
  ssize_t n = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  return n < 0 ? -1 : static_cast<int64_t>(n);
}

std::string LibraryVersion() {
  unsigned a = 0, b = 0, c = 0;
  H5get_libversion(&a, &b, &c);
  return std::to_string(a) + "." + std::to_string(b) + "." + std::to_string(c);
}

}  // namespace ucp::h5
