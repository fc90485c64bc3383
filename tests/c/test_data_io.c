/*
** test_data_io.c -- the file readers and file-backed dataset sources:
**
**   - em_image_save / em_image_load: PNG gray and RGB round trips exact (also from
**     a strided tensor), JPEG quality 95 within a small error;
**   - the images of tests/fixtures/data/ (gen_images.py, written by PIL): decoded
**     exactly as PIL decodes them (baseline, 4:4:4, progressive and gray JPEG,
**     RGBA, palette and 16-bit PNG, to RGB and as stored);
**   - missing, empty, non-image, truncated and corrupt files: EM_ERR_IO naming
**     the file, nothing leaked; bad arguments to save and load;
**   - CIFAR-10 batch files written here: values, label_base, the truncated-record
**     and bad-label errors;
**   - the CSV fixtures: values, header, label by name and by index, int64 and
**     float32 labels, and each malformed file's error with its line;
**   - em_data_idx: pairing, label_base, (N, 1, H, W) images, the mismatch and
**     truncation messages;
**   - em_data_image_folder over class folders made here: order, labels, skipped
**     files, gray to RGB, bilinear resize, batching, a corrupt file named.
*/
#include "check.h"
#include "fixtures.h"
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <png.h>

static void write_bytes(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) { printf("  test bug: can't write %s\n", path); return; }
  if (n) fwrite(b, 1, n, f);
  fclose(f);
}

/* The first n bytes of a file into buf (malloc'd); returns its size. */
static size_t read_bytes(const char *path, unsigned char **buf) {
  FILE *f = fopen(path, "rb");
  *buf = NULL;
  if (!f) return 0;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  *buf = malloc((size_t)n + 1);
  size_t got = fread(*buf, 1, (size_t)n, f);
  fclose(f);
  return got;
}

/* A uint8 (C, H, W) image with value(c, y, x) = (a*c + b*y + d*x + e) & 255. */
static em_tensor *make_image(em_state *S, int C, int H, int W, int a, int b, int d, int e) {
  em_tensor *t = NULL;
  if (em_empty(S, (const int64_t[]){C, H, W}, 3, EM_UINT8, EM_CPU, &t)) return NULL;
  uint8_t *p = em_tensor_data(t);
  for (int c = 0; c < C; c++)
    for (int y = 0; y < H; y++)
      for (int x = 0; x < W; x++) p[(c * H + y) * W + x] = (uint8_t)((a * c + b * y + d * x + e) & 255);
  return t;
}

/* Every element of a and b equal (any strides); both of the same shape. */
static int same_pixels(const em_tensor *a, const em_tensor *b) {
  if (!a || !b || em_tensor_numel(a) != em_tensor_numel(b)) return 0;
  for (int64_t i = 0; i < em_tensor_numel(a); i++)
    if (t_get(a, i) != t_get(b, i)) return 0;
  return 1;
}

static double mean_abs_diff(const em_tensor *a, const em_tensor *b) {
  double s = 0;
  int64_t n = em_tensor_numel(a);
  for (int64_t i = 0; i < n; i++) s += fabs(t_get(a, i) - t_get(b, i));
  return n ? s / (double)n : 1e9;
}

/* -- Images ------------------------------------------------------------------------ */

static void test_png_roundtrip(em_state *S) {
  em_tensor *gray = make_image(S, 1, 5, 7, 0, 37, 11, 3);
  em_tensor *rgb = make_image(S, 3, 6, 4, 90, 41, 13, 250);
  REQUIRE(gray && rgb, "images made");
  em_tensor *back;
  REQUIRE_OK(S, em_image_save(S, tmp_path("gray.png"), gray, 0));
  REQUIRE_OK(S, em_image_load(S, tmp_path("gray.png"), 0, &back));
  CHECK_SHAPE(back, SHP(1, 5, 7));
  CHECK_DTYPE(back, EM_UINT8);
  CHECK(same_pixels(back, gray), "gray PNG round trip exact");
  em_tensor_release(back);
  /* gray read as RGB: the one plane three times */
  REQUIRE_OK(S, em_image_load(S, tmp_path("gray.png"), 3, &back));
  CHECK_SHAPE(back, SHP(3, 5, 7));
  int ok = 1;
  for (int64_t i = 0; back && i < 3 * 35; i++) ok &= t_get(back, i) == t_get(gray, i % 35);
  CHECK(ok, "gray expanded to RGB");
  em_tensor_release(back);

  REQUIRE_OK(S, em_image_save(S, tmp_path("rgb.PNG"), rgb, 0));
  REQUIRE_OK(S, em_image_load(S, tmp_path("rgb.PNG"), 3, &back));
  CHECK_SHAPE(back, SHP(3, 6, 4));
  CHECK(same_pixels(back, rgb), "RGB PNG round trip exact");
  em_tensor_release(back);

  /* a strided source: (3, W, H) transposed to (3, H, W) */
  em_tensor *wh = make_image(S, 3, 4, 6, 50, 9, 21, 1), *tr = NULL;
  CHECK_OK(S, em_transpose(S, wh, 1, 2, &tr));
  if (tr) {
    CHECK_OK(S, em_image_save(S, tmp_path("strided.png"), tr, 0));
    back = NULL;
    CHECK_OK(S, em_image_load(S, tmp_path("strided.png"), 0, &back));
    CHECK_SHAPE(back, SHP(3, 6, 4));
    CHECK(same_pixels(back, tr), "strided source saved in logical order");
    em_tensor_release(back);
  }
  em_tensor_release(tr);
  em_tensor_release(wh);
  em_tensor_release(gray);
  em_tensor_release(rgb);
}

/* A PNG written here with libpng: interlaced or not, 8 or 16 bits, any colour
** type; sample k of pixel (y, x) is ((y * 31 + x * 17 + k * 71) * 257) at 16 bits
** (so its high byte, the 8-bit value, is (y * 31 + x * 17 + k * 71) & 255). */
static int png_sample(int y, int x, int k) { return (y * 31 + x * 17 + k * 71) & 255; }
static void write_png(const char *path, int w, int h, int ctype, int depth, int interlace) {
  FILE *f = fopen(path, "wb");
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) { printf("  test bug: libpng write failed\n"); fclose(f); return; }
  png_init_io(png, f);
  png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, depth, ctype,
               interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  int ch = ctype == PNG_COLOR_TYPE_GRAY ? 1 : ctype == PNG_COLOR_TYPE_GRAY_ALPHA ? 2
         : ctype == PNG_COLOR_TYPE_RGB ? 3 : 4;
  int bps = depth / 8;
  png_bytep *rows = malloc(sizeof(png_bytep) * (size_t)h);
  for (int y = 0; y < h; y++) {
    rows[y] = malloc((size_t)w * ch * bps);
    for (int x = 0; x < w; x++)
      for (int k = 0; k < ch; k++) {
        int v = png_sample(y, x, k);
        if (bps == 2) {
          rows[y][(x * ch + k) * 2] = (png_byte)v;
          rows[y][(x * ch + k) * 2 + 1] = (png_byte)(255 - v);   /* low byte: ignored */
        } else rows[y][x * ch + k] = (png_byte)v;
      }
  }
  png_write_image(png, rows);
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  for (int y = 0; y < h; y++) free(rows[y]);
  free(rows);
  fclose(f);
}

static void test_png_kinds(em_state *S) {
  static const struct { int ctype, depth, interlace, channels, C; const char *what; } k[] = {
    {PNG_COLOR_TYPE_RGB, 8, 1, 0, 3, "interlaced RGB"},
    {PNG_COLOR_TYPE_GRAY, 8, 1, 0, 1, "interlaced gray"},
    {PNG_COLOR_TYPE_GRAY, 8, 1, 3, 3, "interlaced gray to RGB"},
    {PNG_COLOR_TYPE_RGB_ALPHA, 16, 0, 3, 3, "16-bit RGBA to RGB"},
    {PNG_COLOR_TYPE_RGB_ALPHA, 16, 1, 0, 4, "16-bit interlaced RGBA as stored"},
    {PNG_COLOR_TYPE_GRAY_ALPHA, 8, 0, 0, 2, "gray+alpha as stored"},
    {PNG_COLOR_TYPE_GRAY_ALPHA, 16, 0, 3, 3, "16-bit gray+alpha to RGB"},
  };
  const int W = 11, H = 7;
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    write_png(tmp_path("kind.png"), W, H, k[i].ctype, k[i].depth, k[i].interlace);
    em_tensor *t = NULL;
    if (!CHECK_OK(S, em_image_load(S, tmp_path("kind.png"), k[i].channels, &t))) continue;
    char why[160];
    CHECK(t_shape_is(t, (const int64_t[]){k[i].C, H, W}, 3, why, sizeof why), "%s: %s",
          k[i].what, why);
    int gray_src = k[i].ctype == PNG_COLOR_TYPE_GRAY || k[i].ctype == PNG_COLOR_TYPE_GRAY_ALPHA;
    int bad = 0;
    for (int c = 0; c < k[i].C && em_tensor_numel(t) == (int64_t)k[i].C * H * W; c++)
      for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
          /* gray expanded to RGB repeats sample 0; otherwise channel c is sample c */
          int want = png_sample(y, x, gray_src && k[i].channels == 3 ? 0 : c);
          bad += t_get(t, ((int64_t)c * H + y) * W + x) != want;
        }
    CHECK(bad == 0, "%s: %d pixels differ", k[i].what, bad);
    em_tensor_release(t);
  }
}

static void test_jpeg_roundtrip(em_state *S) {
  /* smooth content: JPEG at quality 95 stays close */
  em_tensor *rgb = make_image(S, 3, 24, 32, 50, 2, 2, 10);
  em_tensor *gray = make_image(S, 1, 16, 20, 0, 6, 4, 30);
  REQUIRE(rgb && gray, "images made");
  em_tensor *back;
  REQUIRE_OK(S, em_image_save(S, tmp_path("rgb.jpg"), rgb, 95));
  REQUIRE_OK(S, em_image_load(S, tmp_path("rgb.jpg"), 3, &back));
  CHECK_SHAPE(back, SHP(3, 24, 32));
  double e = mean_abs_diff(back, rgb);
  CHECK(e < 3, "RGB JPEG q95 mean abs error %.3f", e);
  em_tensor_release(back);
  REQUIRE_OK(S, em_image_save(S, tmp_path("gray.jpeg"), gray, 95));
  REQUIRE_OK(S, em_image_load(S, tmp_path("gray.jpeg"), 0, &back));
  CHECK_SHAPE(back, SHP(1, 16, 20));
  e = mean_abs_diff(back, gray);
  CHECK(e < 3, "gray JPEG q95 mean abs error %.3f", e);
  em_tensor_release(back);
  /* quality matters: q10 is worse than q95 but still an image of the same size */
  REQUIRE_OK(S, em_image_save(S, tmp_path("low.jpg"), rgb, 10));
  REQUIRE_OK(S, em_image_load(S, tmp_path("low.jpg"), 0, &back));
  CHECK_SHAPE(back, SHP(3, 24, 32));
  double e10 = mean_abs_diff(back, rgb);
  CHECK(e10 > e, "q10 error %.3f above q95's %.3f", e10, e);
  em_tensor_release(back);
  em_tensor_release(rgb);
  em_tensor_release(gray);
}

/* images.txt: `file channels C H W v...` per line, PIL's decoded pixels. */
static void test_pil_fixtures(em_state *S) {
  FILE *f = fopen(fixture("images.txt"), "r");
  REQUIRE(f != NULL, "can't open %s", fixture("images.txt"));
  char name[128];
  int channels, C, H, W, count = 0;
  while (fscanf(f, "%127s %d %d %d %d", name, &channels, &C, &H, &W) == 5) {
    int64_t n = (int64_t)C * H * W;
    double *want = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
      int v = -1;
      if (fscanf(f, "%d", &v) != 1) break;
      want[i] = v;
    }
    em_tensor *t = NULL;
    if (CHECK_OK(S, em_image_load(S, fixture(name), channels, &t))) {
      char why[160];
      CHECK(t_shape_is(t, (const int64_t[]){C, H, W}, 3, why, sizeof why), "%s: %s", name, why);
      CHECK(t_values(t, want, n, 0, why, sizeof why), "%s (channels %d) vs PIL: %s", name,
            channels, why);
    }
    em_tensor_release(t);
    free(want);
    count++;
  }
  fclose(f);
  CHECK(count == 9, "%d fixture images", count);
}

static void expect_io(em_state *S, const char *path, const char *needle) {
  em_tensor *t = (em_tensor *)1;
  em_status st = em_image_load(S, path, 3, &t);
  CHECK(st == EM_ERR_IO, "status %d for %s (%s)", st, path, em_errmsg(S));
  CHECK(t == NULL, "out cleared on error");
  CHECK(strstr(em_errmsg(S), needle) && strstr(em_errmsg(S), path),
        "message '%s' should name the file and say '%s'", em_errmsg(S), needle);
}

static void test_bad_images(em_state *S) {
  expect_io(S, tmp_path("missing.png"), "can't open");
  write_bytes(tmp_path("text.jpg"), "hello, not an image\n", 20);
  expect_io(S, tmp_path("text.jpg"), "not a JPEG or PNG file");
  write_bytes(tmp_path("empty.png"), "", 0);
  expect_io(S, tmp_path("empty.png"), "not a JPEG or PNG file");
  expect_io(S, dir, "not a regular file");

  unsigned char *jpg, *png;
  size_t nj = read_bytes(fixture("pil_rgb.jpg"), &jpg);
  size_t np = read_bytes(fixture("pil_rgba.png"), &png);
  REQUIRE(nj > 200 && np > 100, "fixtures read");
  /* truncated at many lengths: always EM_ERR_IO, never a crash or a grey image */
  int io = 0, tries = 0;
  for (size_t n = 3; n < nj - 2; n += 37, tries++) {
    write_bytes(tmp_path("cut.jpg"), jpg, n);
    em_tensor *t = NULL;
    em_status st = em_image_load(S, tmp_path("cut.jpg"), 3, &t);
    io += st == EM_ERR_IO && strstr(em_errmsg(S), "cut.jpg") != NULL;
    em_tensor_release(t);
  }
  CHECK(io == tries, "%d of %d truncated JPEGs failed with the file named", io, tries);
  write_bytes(tmp_path("half.jpg"), jpg, nj / 2);
  expect_io(S, tmp_path("half.jpg"), "truncated");
  io = tries = 0;
  for (size_t n = 8; n < np - 12; n += 11, tries++) {   /* a missing IEND is let go */
    write_bytes(tmp_path("cut.png"), png, n);
    em_tensor *t = NULL;
    em_status st = em_image_load(S, tmp_path("cut.png"), 0, &t);
    io += st == EM_ERR_IO && strstr(em_errmsg(S), "cut.png") != NULL;
    em_tensor_release(t);
  }
  CHECK(io == tries, "%d of %d truncated PNGs failed with the file named", io, tries);
  /* corrupt: a JPEG signature then garbage; a PNG with a damaged chunk */
  unsigned char junk[300];
  for (int i = 0; i < 300; i++) junk[i] = (unsigned char)(i * 97 + 13);
  junk[0] = 0xff; junk[1] = 0xd8; junk[2] = 0xff;
  write_bytes(tmp_path("junk.jpg"), junk, sizeof junk);
  expect_io(S, tmp_path("junk.jpg"), "corrupt JPEG");
  png[np / 2] ^= 0x55;
  write_bytes(tmp_path("flip.png"), png, np);
  expect_io(S, tmp_path("flip.png"), "corrupt PNG");
  /* every byte of each file damaged in turn: decoded or EM_ERR_IO, never a crash
  ** (libjpeg and libpng errors longjmp back; run under SANITIZE=1 for memory) */
  const char *names[2] = {"pil_progressive.jpg", "pil_palette.png"};
  for (int k = 0; k < 2; k++) {
    unsigned char *b;
    size_t nb = read_bytes(fixture(names[k]), &b);
    int clean = 0;
    for (size_t i = 0; i < nb; i++) {
      unsigned char keep = b[i];
      b[i] ^= (unsigned char)(0x5a + i);
      write_bytes(tmp_path(k ? "fuzz.png" : "fuzz.jpg"), b, nb);
      b[i] = keep;
      em_tensor *t = NULL;
      em_status st = em_image_load(S, tmp_path(k ? "fuzz.png" : "fuzz.jpg"), 3, &t);
      clean += (st == EM_OK && t && em_tensor_size(t, 0) == 3) ||
               (st == EM_ERR_IO && !t && strstr(em_errmsg(S), k ? "fuzz.png" : "fuzz.jpg"));
      em_tensor_release(t);
    }
    CHECK(clean == (int)nb, "%s: %d of %zu damaged files decoded or failed cleanly", names[k],
          clean, nb);
    free(b);
  }
  free(jpg);
  free(png);

  /* arguments */
  em_tensor *t = NULL;
  CHECK_ERR(S, em_image_load(S, fixture("pil_rgb.jpg"), 2, &t), EM_ERR_ARG, "channels");
  em_tensor *img = make_image(S, 3, 4, 4, 1, 2, 3, 4), *f32 = NULL, *four = NULL;
  REQUIRE(img != NULL, "image made");
  CHECK_ERR(S, em_image_save(S, tmp_path("x.bmp"), img, 0), EM_ERR_ARG, "x.bmp", ".png");
  CHECK_ERR(S, em_image_save(S, tmp_path("x.jpg"), img, 101), EM_ERR_ARG, "quality");
  CHECK_OK(S, em_empty(S, SHP(3, 4, 4), EM_FLOAT32, EM_CPU, &f32));
  CHECK_ERR(S, em_image_save(S, tmp_path("f.png"), f32, 0), EM_ERR_DTYPE, "uint8");
  CHECK_OK(S, em_empty(S, SHP(4, 4, 4), EM_UINT8, EM_CPU, &four));
  CHECK_ERR(S, em_image_save(S, tmp_path("four.png"), four, 0), EM_ERR_SHAPE, "[4,4,4]");
  CHECK_ERR(S, em_image_save(S, "/nonexistent-dir/a.png", img, 0), EM_ERR_IO,
            "/nonexistent-dir/a.png");
  em_tensor_release(img);
  em_tensor_release(f32);
  em_tensor_release(four);
  CHECK(em_memory_allocated(S) == 0, "nothing leaked: %lld bytes live",
        (long long)em_memory_allocated(S));
}

/* -- CIFAR-10 ------------------------------------------------------------------------ */

/* n records, record r (global index base + r) with label (base+r) % 10 and
** pixel j = (7 * (base + r) + j) & 255. */
static void write_cifar(const char *path, int base, int n, size_t cut) {
  size_t size = (size_t)n * 3073;
  unsigned char *b = malloc(size);
  for (int r = 0; r < n; r++) {
    b[r * 3073] = (unsigned char)((base + r) % 10);
    for (int j = 0; j < 3072; j++) b[r * 3073 + 1 + j] = (unsigned char)((7 * (base + r) + j) & 255);
  }
  write_bytes(path, b, size - cut);
  free(b);
}

static void test_cifar(em_state *S) {
  char p1[256], p2[256];
  snprintf(p1, sizeof p1, "%s", tmp_path("data_batch_1.bin"));
  snprintf(p2, sizeof p2, "%s", tmp_path("data_batch_2.bin"));
  write_cifar(p1, 0, 3, 0);
  write_cifar(p2, 3, 12, 0);
  const char *files[2] = {p1, p2};
  em_dataset *d = NULL;
  REQUIRE_OK(S, em_data_cifar10(S, files, 2, 1, &d));
  CHECK(em_dataset_len(d) == 15 && em_dataset_nfields(d) == 2, "15 samples of 2 fields");
  CHECK(!strcmp(em_dataset_kind(d), "cifar10"), "kind %s", em_dataset_kind(d));
  int ok = 1;
  for (int i = 0; i < 15; i += 2) {
    em_tensor *s[2] = {NULL, NULL};
    if (!CHECK_OK(S, em_dataset_get(S, d, i, 0, s))) break;
    CHECK_SHAPE(s[0], SHP(3, 32, 32));
    CHECK_DTYPE(s[0], EM_UINT8);
    CHECK_DTYPE(s[1], EM_INT64);
    CHECK(em_tensor_ndim(s[1]) == 0 && t_get(s[1], 0) == i % 10 + 1, "label of %d is %g", i,
          s[1] ? t_get(s[1], 0) : -1);
    /* (c, y, x) is byte c*1024 + y*32 + x of the record's image */
    for (int j = 0; j < 3072; j += 101) ok &= t_get(s[0], j) == ((7 * i + j) & 255);
    ok &= t_get(s[0], 3071) == ((7 * i + 3071) & 255);
    em_tensor_release(s[0]);
    em_tensor_release(s[1]);
  }
  CHECK(ok, "pixels in R, G, B plane order");
  em_dataset_release(d);

  d = NULL;
  write_cifar(tmp_path("short.bin"), 0, 4, 1);
  const char *bad[2] = {p1, tmp_path("short.bin")};
  CHECK_ERR(S, em_data_cifar10(S, bad, 2, 0, &d), EM_ERR_IO, "short.bin", "truncated record 4",
            "12291 bytes", "3073");
  CHECK(d == NULL, "no dataset on error");
  write_cifar(tmp_path("label.bin"), 8, 3, 0);   /* labels 8, 9, 0 */
  unsigned char *b;
  size_t n = read_bytes(tmp_path("label.bin"), &b);
  b[3073] = 10;
  write_bytes(tmp_path("label.bin"), b, n);
  free(b);
  const char *lab[1] = {tmp_path("label.bin")};
  CHECK_ERR(S, em_data_cifar10(S, lab, 1, 0, &d), EM_ERR_IO, "label.bin", "record 2",
            "label 10");
  const char *missing[1] = {tmp_path("nope.bin")};
  CHECK_ERR(S, em_data_cifar10(S, missing, 1, 0, &d), EM_ERR_IO, "can't open", "nope.bin");
  write_bytes(tmp_path("empty.bin"), "", 0);
  const char *empty[1] = {tmp_path("empty.bin")};
  CHECK_ERR(S, em_data_cifar10(S, empty, 1, 0, &d), EM_ERR_IO, "empty.bin", "empty");
  CHECK_ERR(S, em_data_cifar10(S, files, 0, 0, &d), EM_ERR_ARG, "cifar10");
  CHECK(em_memory_allocated(S) == 0, "nothing leaked: %lld bytes live",
        (long long)em_memory_allocated(S));
}

/* -- CSV ------------------------------------------------------------------------------- */

/* Sample i's features and label against want. */
static void check_row(em_state *S, em_dataset *d, int64_t i, const double *x, int64_t nx,
                      double y, em_dtype ydt) {
  em_tensor *s[2] = {NULL, NULL};
  if (!CHECK_OK(S, em_dataset_get(S, d, i, 0, s))) return;
  CHECK_DTYPE(s[0], EM_FLOAT32);
  CHECK_VALS(s[0], 0, x, nx);
  if (em_dataset_nfields(d) == 2) {
    CHECK_DTYPE(s[1], ydt);
    CHECK(s[1] && em_tensor_ndim(s[1]) == 0 && t_get(s[1], 0) == y, "label %g, want %g",
          s[1] ? t_get(s[1], 0) : -1, y);
  }
  em_tensor_release(s[0]);
  em_tensor_release(s[1]);
}

static void test_csv(em_state *S) {
  em_dataset *d = NULL;
  /* header, CRLF, blank lines, spaces around a field; label by name */
  REQUIRE_OK(S, em_data_csv(S, fixture("basic.csv"), 1, "label", -1, &d));
  CHECK(em_dataset_len(d) == 3 && em_dataset_nfields(d) == 2, "3 rows, 2 fields");
  CHECK(!strcmp(em_dataset_kind(d), "csv"), "kind %s", em_dataset_kind(d));
  check_row(S, d, 0, V(1, 2.5, -3), 0, EM_INT64);
  check_row(S, d, 1, V(4, 0.5, 6), 2, EM_INT64);
  check_row(S, d, 2, V(-7.25, 8, 9), 1, EM_INT64);
  em_dataset_release(d);
  /* the same column by index; and no label at all */
  REQUIRE_OK(S, em_data_csv(S, fixture("basic.csv"), 1, NULL, 3, &d));
  check_row(S, d, 1, V(4, 0.5, 6), 2, EM_INT64);
  em_dataset_release(d);
  REQUIRE_OK(S, em_data_csv(S, fixture("basic.csv"), 1, NULL, -1, &d));
  CHECK(em_dataset_nfields(d) == 1, "no label: 1 field");
  check_row(S, d, 2, V(-7.25, 8, 9, 1), 0, EM_INT64);
  em_dataset_release(d);
  /* no header, a float label in the first column (kept as written) */
  REQUIRE_OK(S, em_data_csv(S, fixture("float_label.csv"), 0, NULL, 0, &d));
  CHECK(em_dataset_len(d) == 3, "3 rows");
  check_row(S, d, 0, V(1, 2), 0.5, EM_FLOAT32);
  check_row(S, d, 1, V(3, 4), 1.25, EM_FLOAT32);
  check_row(S, d, 2, V(5, 6), -2, EM_FLOAT32);
  em_dataset_release(d);
  /* a middle column as label: integral, so int64 */
  REQUIRE_OK(S, em_data_csv(S, fixture("float_label.csv"), 0, NULL, 1, &d));
  check_row(S, d, 2, V(-2, 6), 5, EM_INT64);
  em_dataset_release(d);
  d = NULL;

  /* errors: file and 1-based line and field */
  CHECK_ERR(S, em_data_csv(S, fixture("bad_number.csv"), 1, NULL, -1, &d), EM_ERR_IO,
            "bad_number.csv' line 7: field 3 'abc' is not a number");
  CHECK_ERR(S, em_data_csv(S, fixture("bad_count.csv"), 1, NULL, -1, &d), EM_ERR_IO,
            "bad_count.csv' line 9: 4 fields, expected 5");
  CHECK_ERR(S, em_data_csv(S, fixture("empty_field.csv"), 0, NULL, -1, &d), EM_ERR_IO,
            "empty_field.csv' line 2: field 2 '' is not a number");
  CHECK_ERR(S, em_data_csv(S, fixture("basic.csv"), 1, "y", -1, &d), EM_ERR_ARG,
            "no column named 'y'", "x1, x2, x3, label", "basic.csv");
  CHECK_ERR(S, em_data_csv(S, fixture("float_label.csv"), 0, "y", -1, &d), EM_ERR_ARG,
            "without a header");
  CHECK_ERR(S, em_data_csv(S, fixture("basic.csv"), 1, NULL, 4, &d), EM_ERR_ARG,
            "label column 4", "4 fields");
  CHECK_ERR(S, em_data_csv(S, fixture("empty.csv"), 1, NULL, -1, &d), EM_ERR_IO,
            "empty.csv", "empty file");
  CHECK_ERR(S, em_data_csv(S, fixture("header_only.csv"), 1, NULL, -1, &d), EM_ERR_IO,
            "header_only.csv", "no data rows");
  /* without a header, basic.csv's header line is a bad number */
  CHECK_ERR(S, em_data_csv(S, fixture("basic.csv"), 0, NULL, -1, &d), EM_ERR_IO,
            "line 1: field 1 'x1' is not a number");
  CHECK_ERR(S, em_data_csv(S, tmp_path("none.csv"), 1, NULL, -1, &d), EM_ERR_IO,
            "can't open", "none.csv");
  CHECK(d == NULL, "no dataset on error");
  CHECK(em_memory_allocated(S) == 0, "nothing leaked: %lld bytes live",
        (long long)em_memory_allocated(S));
}

/* -- IDX source ------------------------------------------------------------------------ */

static void write_idx(const char *path, int n, int h, int w, int images, size_t cut) {
  unsigned char b[256];
  size_t k = 0;
  b[k++] = 0; b[k++] = 0; b[k++] = 0x08; b[k++] = images ? 3 : 1;
  int dims[3] = {n, h, w};
  for (int d = 0; d < (images ? 3 : 1); d++) {
    b[k++] = 0; b[k++] = 0; b[k++] = 0; b[k++] = (unsigned char)dims[d];
  }
  int count = images ? n * h * w : n;
  for (int i = 0; i < count; i++) b[k++] = (unsigned char)(images ? i * 3 : (i + 2) % 10);
  write_bytes(path, b, k - cut);
}

static void test_idx_source(em_state *S) {
  char img[256], lab[256];
  snprintf(img, sizeof img, "%s", tmp_path("images-idx3-ubyte"));
  snprintf(lab, sizeof lab, "%s", tmp_path("labels-idx1-ubyte"));
  write_idx(img, 3, 2, 2, 1, 0);
  write_idx(lab, 3, 0, 0, 0, 0);
  em_dataset *d = NULL;
  REQUIRE_OK(S, em_data_idx(S, img, lab, 1, &d));
  CHECK(em_dataset_len(d) == 3 && em_dataset_nfields(d) == 2, "3 samples");
  CHECK(!strcmp(em_dataset_kind(d), "idx"), "kind %s", em_dataset_kind(d));
  em_tensor *s[2] = {NULL, NULL};
  if (CHECK_OK(S, em_dataset_get(S, d, 2, 0, s))) {
    CHECK_SHAPE(s[0], SHP(1, 2, 2));
    CHECK_DTYPE(s[0], EM_UINT8);
    CHECK_VALS(s[0], 0, V(24, 27, 30, 33));
    CHECK_DTYPE(s[1], EM_INT64);
    CHECK(s[1] && t_get(s[1], 0) == 5, "label (2+2)%%10 + 1 = 5, got %g", s[1] ? t_get(s[1], 0) : -1);
  }
  em_tensor_release(s[0]);
  em_tensor_release(s[1]);
  em_dataset_release(d);
  d = NULL;
  char lab2[256];
  snprintf(lab2, sizeof lab2, "%s", tmp_path("labels2"));
  write_idx(lab2, 2, 0, 0, 0, 0);
  CHECK_ERR(S, em_data_idx(S, img, lab2, 0, &d), EM_ERR_SHAPE, img, lab2, "3 images",
            "2 labels");
  write_idx(img, 3, 2, 2, 1, 3);   /* record 3 of 3 cut short */
  CHECK_ERR(S, em_data_idx(S, img, lab, 0, &d), EM_ERR_IO, img, "truncated at record 3 of 3");
  write_idx(img, 3, 2, 2, 1, 6);   /* records 2 and 3 */
  CHECK_ERR(S, em_data_idx(S, img, lab, 0, &d), EM_ERR_IO, "truncated at record 2 of 3");
  CHECK_ERR(S, em_data_idx(S, lab, lab, 0, &d), EM_ERR_SHAPE, "uint8 (N, H, W)");
  /* a gzip file cut short: the record named is the first one that does not
  ** inflate whole (counted here byte by byte) */
  {
    enum { N = 40, R = 28 * 28 };
    unsigned char *raw = malloc(16 + N * R);
    memcpy(raw, (const unsigned char[]){0, 0, 8, 3, 0, 0, 0, N, 0, 0, 0, 28, 0, 0, 0, 28}, 16);
    uint32_t x = 1;
    for (int i = 0; i < N * R; i++) raw[16 + i] = (unsigned char)((x = x * 1664525u + 1013904223u) >> 24);
    char gz[256];
    snprintf(gz, sizeof gz, "%s", tmp_path("images.gz"));
    gzFile g = gzopen(gz, "wb");
    gzwrite(g, raw, 16 + N * R);
    gzclose(g);
    unsigned char *z;
    size_t nz = read_bytes(gz, &z);
    write_bytes(gz, z, nz / 2);
    free(z);
    g = gzopen(gz, "rb");
    long ok = 0;
    unsigned char byte;
    while (gzread(g, &byte, 1) == 1) ok++;
    gzclose(g);
    char want[64];
    snprintf(want, sizeof want, "truncated at record %ld of %d", (ok - 16) / R + 1, N);
    CHECK(ok > 16 + R && ok < 16 + (N - 1) * R, "cut inside the data (%ld bytes inflate)", ok);
    em_tensor *t = NULL;
    CHECK_ERR(S, em_idx_load(S, gz, &t), EM_ERR_IO, "images.gz", want);
    free(raw);
  }
  CHECK(d == NULL, "no dataset on error");
  CHECK(em_memory_allocated(S) == 0, "nothing leaked: %lld bytes live",
        (long long)em_memory_allocated(S));
}

/* -- Image folders ---------------------------------------------------------------------- */

static void save_to(em_state *S, const char *path, em_tensor *img) {
  if (!img || em_image_save(S, path, img, 95)) printf("  test bug: can't save %s: %s\n", path, em_errmsg(S));
  em_tensor_release(img);
}

static void test_image_folder(em_state *S) {
  char root[128], p[256];
  snprintf(root, sizeof root, "%s/folder", dir);
  const char *sub[] = {"", "/dog", "/cat", "/eel", "/.hidden", "/empty"};
  for (size_t k = 0; k < sizeof sub / sizeof *sub; k++) {
    snprintf(p, sizeof p, "%s%s", root, sub[k]);
    mkdir(p, 0700);
  }
  /* cat: b.png (rgb 3x5), a.jpg (constant 2x2); dog: x.PNG (gray 1x2 [0, 200]);
  ** eel: d.png (constant gray 3x3), c.jpeg; plus files that don't count */
  em_tensor *b = make_image(S, 3, 3, 5, 70, 20, 9, 5);
  snprintf(p, sizeof p, "%s/cat/b.png", root); em_tensor_retain(b); save_to(S, p, b);
  snprintf(p, sizeof p, "%s/cat/a.jpg", root); save_to(S, p, make_image(S, 3, 2, 2, 0, 0, 0, 128));
  snprintf(p, sizeof p, "%s/dog/x.PNG", root); save_to(S, p, make_image(S, 1, 1, 2, 0, 0, 200, 0));
  snprintf(p, sizeof p, "%s/eel/d.png", root); save_to(S, p, make_image(S, 1, 3, 3, 0, 0, 0, 77));
  snprintf(p, sizeof p, "%s/eel/c.jpeg", root); save_to(S, p, make_image(S, 3, 4, 4, 0, 0, 0, 30));
  snprintf(p, sizeof p, "%s/cat/notes.txt", root); write_bytes(p, "not an image", 12);
  snprintf(p, sizeof p, "%s/.hidden/h.png", root); save_to(S, p, make_image(S, 1, 2, 2, 0, 0, 0, 1));
  snprintf(p, sizeof p, "%s/top.png", root); save_to(S, p, make_image(S, 1, 2, 2, 0, 0, 0, 1));

  em_dataset *d = NULL;
  REQUIRE_OK(S, em_data_image_folder(S, root, 0, 0, 1, &d));
  CHECK(em_dataset_len(d) == 5 && em_dataset_nfields(d) == 2, "5 images, got %lld",
        (long long)em_dataset_len(d));
  CHECK(!strcmp(em_dataset_kind(d), "image_folder"), "kind %s", em_dataset_kind(d));
  /* cat/a.jpg cat/b.png dog/x.PNG eel/c.jpeg eel/d.png; labels from 1 */
  const int64_t labels[5] = {1, 1, 2, 3, 3};
  const int64_t shapes[5][2] = {{2, 2}, {3, 5}, {1, 2}, {4, 4}, {3, 3}};
  for (int i = 0; i < 5; i++) {
    em_tensor *s[2] = {NULL, NULL};
    if (!CHECK_OK(S, em_dataset_get(S, d, i, 0, s))) continue;
    CHECK_SHAPE(s[0], (const int64_t[]){3, shapes[i][0], shapes[i][1]}, 3);
    CHECK_DTYPE(s[0], EM_UINT8);
    CHECK_DTYPE(s[1], EM_INT64);
    CHECK(s[1] && em_tensor_ndim(s[1]) == 0 && t_get(s[1], 0) == labels[i],
          "sample %d label %g, want %lld", i, s[1] ? t_get(s[1], 0) : -1, (long long)labels[i]);
    if (i == 1) CHECK(same_pixels(s[0], b), "cat/b.png exact");
    if (i == 2) CHECK_VALS(s[0], 0, V(0, 200, 0, 200, 0, 200));   /* gray to RGB */
    if (i == 3) {
      double e = 0;
      for (int64_t j = 0; j < 48; j++) e = fmax(e, fabs(t_get(s[0], j) - 30));
      CHECK(e <= 1, "constant JPEG stays constant (max error %g)", e);
    }
    em_tensor_release(s[0]);
    em_tensor_release(s[1]);
  }
  em_dataset_release(d);

  /* resized to 1x4 (bilinear, half-pixel centres): [0, 200] -> [0, 50, 150, 200] */
  REQUIRE_OK(S, em_data_image_folder(S, root, 1, 4, 0, &d));
  em_tensor *s[2] = {NULL, NULL};
  if (CHECK_OK(S, em_dataset_get(S, d, 2, 0, s))) {
    CHECK_SHAPE(s[0], SHP(3, 1, 4));
    CHECK_DTYPE(s[0], EM_UINT8);
    CHECK_VALS(s[0], 0, V(0, 50, 150, 200, 0, 50, 150, 200, 0, 50, 150, 200));
    CHECK(s[1] && t_get(s[1], 0) == 1, "dog is class 1 from base 0");
  }
  em_tensor_release(s[0]);
  em_tensor_release(s[1]);
  if (CHECK_OK(S, em_dataset_get(S, d, 4, 0, s))) {
    CHECK_SHAPE(s[0], SHP(3, 1, 4));
    CHECK_VALS(s[0], 0, V(77, 77, 77, 77, 77, 77, 77, 77, 77, 77, 77, 77));
  }
  em_tensor_release(s[0]);
  em_tensor_release(s[1]);
  /* batched: samples of one size stack */
  em_dataset *bd = NULL;
  if (CHECK_OK(S, em_data_batch(S, d, 2, 0, &bd))) {
    CHECK(em_dataset_len(bd) == 3, "3 batches");
    s[0] = s[1] = NULL;
    if (CHECK_OK(S, em_dataset_get(S, bd, 1, 0, s))) {
      CHECK_SHAPE(s[0], SHP(2, 3, 1, 4));
      CHECK_SHAPE(s[1], SHP(2));
      CHECK_VALS(s[1], 0, V(1, 2));
      static const double row0[4] = {0, 50, 150, 200};
      for (int k = 0; k < 4; k++)
        CHECK(s[0] && t_get(s[0], k) == row0[k], "batch row 0 is dog/x.PNG");
    }
    em_tensor_release(s[0]);
    em_tensor_release(s[1]);
  }
  em_dataset_release(bd);
  em_dataset_release(d);
  em_tensor_release(b);

  /* a corrupt file with an image name fails when read, naming it */
  char root2[128];
  snprintf(root2, sizeof root2, "%s/folder2", dir);
  mkdir(root2, 0700);
  snprintf(p, sizeof p, "%s/a", root2);
  mkdir(p, 0700);
  snprintf(p, sizeof p, "%s/a/good.png", root2); save_to(S, p, make_image(S, 3, 2, 2, 1, 1, 1, 1));
  snprintf(p, sizeof p, "%s/a/zbad.jpg", root2); write_bytes(p, "this is text", 12);
  REQUIRE_OK(S, em_data_image_folder(S, root2, 0, 0, 0, &d));
  CHECK(em_dataset_len(d) == 2, "the corrupt file is listed");
  s[0] = s[1] = NULL;
  CHECK_OK(S, em_dataset_get(S, d, 0, 0, s));
  em_tensor_release(s[0]);
  em_tensor_release(s[1]);
  s[0] = s[1] = NULL;
  CHECK_ERR(S, em_dataset_get(S, d, 1, 0, s), EM_ERR_IO, "image_folder", "zbad.jpg",
            "not a JPEG or PNG file");
  CHECK(s[0] == NULL && s[1] == NULL, "no fields on error");
  em_dataset_release(d);
  d = NULL;

  /* construction errors */
  snprintf(p, sizeof p, "%s/missing", dir);
  CHECK_ERR(S, em_data_image_folder(S, p, 0, 0, 0, &d), EM_ERR_IO, "can't read", "missing");
  snprintf(p, sizeof p, "%s/folder/empty", dir);
  CHECK_ERR(S, em_data_image_folder(S, p, 0, 0, 0, &d), EM_ERR_IO, "no class subfolders");
  snprintf(p, sizeof p, "%s/folder3", dir);
  mkdir(p, 0700);
  snprintf(p, sizeof p, "%s/folder3/a", dir);
  mkdir(p, 0700);
  snprintf(p, sizeof p, "%s/folder3/a/readme.txt", dir);
  write_bytes(p, "text", 4);
  snprintf(p, sizeof p, "%s/folder3", dir);
  CHECK_ERR(S, em_data_image_folder(S, p, 0, 0, 0, &d), EM_ERR_IO, "no .jpg, .jpeg or .png",
            "folder3");
  CHECK_ERR(S, em_data_image_folder(S, root, 4, 0, 0, &d), EM_ERR_ARG, "height and width");
  CHECK(d == NULL, "no dataset on error");
  CHECK(em_memory_allocated(S) == 0, "nothing leaked: %lld bytes live",
        (long long)em_memory_allocated(S));
}

/* rm -r of the scratch folder (two levels of folders at most). */
static void remove_tree(const char *path, int depth) {
  DIR *d = opendir(path);
  if (!d) { unlink(path); return; }
  struct dirent *e;
  char p[512];
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    struct stat sb;
    if (depth < 4 && lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) remove_tree(p, depth + 1);
    else unlink(p);
  }
  closedir(d);
  rmdir(path);
}

int main(void) {
  fx_locate(fixtures, sizeof fixtures, "fixtures/data");
  snprintf(dir, sizeof dir, "/tmp/ember-dio-XXXXXX");
  if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
  em_state *S;
  if (em_open(&S, NULL)) { printf("em_open failed\n"); return 1; }
  RUN(test_png_roundtrip, S);
  RUN(test_png_kinds, S);
  RUN(test_jpeg_roundtrip, S);
  RUN(test_pil_fixtures, S);
  RUN(test_bad_images, S);
  RUN(test_cifar, S);
  RUN(test_csv, S);
  RUN(test_idx_source, S);
  RUN(test_image_folder, S);
  em_close(S);
  remove_tree(dir, 0);
  return check_done();
}
