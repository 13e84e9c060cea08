/* files.h: private to the runtime: the data files' common steps (data.c's
 * token shards, npy.c's arrays): the files of a glob in name order, and a
 * file mapped whole and read-only. */
#ifndef TCC_FILES_H
#define TCC_FILES_H

#include <glob.h>
#include <stddef.h>
#include <stdint.h>

/* A file of a stream of items (tokens, examples), mapped whole. */
typedef struct RtFile {
    const char *path;         /* in the loader's glob_t */
    const unsigned char *map; /* the whole file */
    size_t size;              /* bytes */
    const unsigned char *data; /* its first item */
    int64_t count;            /* items */
    int64_t start;            /* the stream index of its first item */
} RtFile;

/* The files matching pattern into g, sorted by name (strcmp, whatever the
 * locale); none is an error ("no file matches 'P'"). 0, or -1 with a message
 * (g is then still for globfree). */
int rt_files_glob(const char *pattern, glob_t *g, char *err, size_t n);
/* path mapped whole and read-only into *map, *size; a file that is not a
 * regular file, or shorter than min bytes ("truncated WHAT (N bytes, a WHAT
 * has MIN)"), is refused.
 * 0, or -1 with a message naming the file. */
int rt_file_map(const char *path, size_t min, const char *what, const unsigned char **map,
                size_t *size, char *err, size_t n);

/* Of n files in stream order (the first starting at 0), the last that starts
 * at or before stream index p. */
size_t rt_files_find(const RtFile *f, size_t n, int64_t p);
/* Unmap the maps of the n files, free f, globfree(g). */
void rt_files_close(RtFile *f, size_t n, glob_t *g);

#endif
